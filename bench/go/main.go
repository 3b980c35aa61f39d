// nsqgo: the go-nsq side of the latency, scale and TLS/compression benchmarks.
//
// Built by bench/gobuild.py against github.com/nsqio/go-nsq v1.1.0 from the Go module proxy;
// run with GOMAXPROCS=1 like the other Go rows. Sub-commands:
//
//	pub   paced (open-loop) publisher of 100-byte bodies carrying a CLOCK_MONOTONIC stamp
//	sub   consumer that records publish-to-handler latency of every timed message
//	tpub  publish_many (MPUB batches) for a fixed time, with optional TLS/Snappy/DEFLATE
//	tsub  consume n pre-filled messages, with optional TLS/Snappy/DEFLATE
//	scale one process, many consumers (lookupd discovery) and one producer per nsqd
//
// Every command prints one line "RESULT {json}" on stdout (sub prints "READY" first).
package main

import (
	"bufio"
	"crypto/tls"
	"encoding/binary"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	nsq "github.com/nsqio/go-nsq"
)

// CLOCK_MONOTONIC in ns, the same clock Python's time.monotonic_ns() reads: one clock_gettime
// at start, then Go's own monotonic reading (vDSO) for the difference.
var monoBase int64
var timeBase time.Time

func initMono() {
	var ts syscall.Timespec
	timeBase = time.Now()
	syscall.Syscall(syscall.SYS_CLOCK_GETTIME, 1, uintptr(unsafe.Pointer(&ts)), 0)
	monoBase = ts.Nano()
}

func mono() int64 { return monoBase + int64(time.Since(timeBase)) }

func cpuSeconds() float64 {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}

func emit(kind string, v map[string]interface{}) {
	b, _ := json.Marshal(v)
	fmt.Printf("%s %s\n", kind, b)
	os.Stdout.Sync()
}

type common struct {
	addr, topic, channel string
	tls, snappy, deflate bool
	obt                  time.Duration
	obs                  int64
	mif                  int
}

func (c *common) flags(fs *flag.FlagSet) {
	fs.StringVar(&c.addr, "addr", "127.0.0.1:4150", "nsqd TCP address (lookupd HTTP for scale)")
	fs.StringVar(&c.topic, "topic", "bench", "topic")
	fs.StringVar(&c.channel, "channel", "bench", "channel")
	fs.BoolVar(&c.tls, "tls", false, "TLS (certificate not verified: benchmark only)")
	fs.BoolVar(&c.snappy, "snappy", false, "Snappy compression")
	fs.BoolVar(&c.deflate, "deflate", false, "DEFLATE compression (level 6)")
	fs.DurationVar(&c.obt, "output-buffer-timeout", 0, "0: nsqd's default")
	fs.Int64Var(&c.obs, "output-buffer-size", 0, "0: go-nsq's default (16384)")
	fs.IntVar(&c.mif, "mif", 2500, "max_in_flight")
}

func (c *common) config() *nsq.Config {
	cfg := nsq.NewConfig()
	cfg.MaxInFlight = c.mif
	if c.tls {
		cfg.TlsV1 = true
		cfg.TlsConfig = &tls.Config{InsecureSkipVerify: true}
	}
	cfg.Snappy = c.snappy
	cfg.Deflate = c.deflate
	if c.obt > 0 {
		cfg.OutputBufferTimeout = c.obt
	}
	if c.obs != 0 {
		cfg.OutputBufferSize = c.obs
	}
	return cfg
}

var stderrLog = log.New(os.Stderr, "", log.LstdFlags)

// ---------------------------------------------------------------- latency
func body(stamp int64, timed bool) []byte {
	b := make([]byte, 100)
	binary.BigEndian.PutUint64(b, uint64(stamp))
	b[8] = 'W'
	if timed {
		b[8] = 'M'
	}
	for i := 9; i < 100; i++ {
		b[i] = 'x'
	}
	return b
}

func pub(args []string) {
	var c common
	fs := flag.NewFlagSet("pub", flag.ExitOnError)
	c.flags(fs)
	rate := fs.Float64("rate", 1000, "messages per second")
	warm := fs.Float64("warmup", 2, "seconds of untimed messages first")
	secs := fs.Float64("seconds", 20, "timed seconds")
	feed := fs.Bool("feed", false, "paced by bytes on stdin ('W' warm-up, 'M' timed), until EOF")
	fs.Parse(args)
	p, err := nsq.NewProducer(c.addr, c.config())
	if err != nil {
		log.Fatal(err)
	}
	p.SetLogger(stderrLog, nsq.LogLevelWarning)
	if err := p.Ping(); err != nil {
		log.Fatal(err)
	}
	if *feed {
		pubFed(p, c.topic)
		return
	}
	nWarm := int64(*warm * *rate)
	total := nWarm + int64(*secs**rate)
	period := float64(1e9) / *rate
	var i, batches int64
	var lagMax int64
	var cpu0 float64
	t0 := mono()
	var tTimed int64
	for i < total {
		now := mono()
		due := int64(float64(now-t0)/period) + 1
		if due > total {
			due = total
		}
		if due <= i {
			time.Sleep(time.Duration(float64(t0) + float64(i)*period - float64(now)))
			continue
		}
		if i < nWarm && due > nWarm {
			due = nWarm // the timed part starts with its own batch
		}
		if lag := now - (t0 + int64(float64(i)*period)); lag > lagMax && i >= nWarm {
			lagMax = lag
		}
		if i == nWarm {
			cpu0 = cpuSeconds()
			tTimed = now
		}
		msgs := make([][]byte, due-i)
		for k := range msgs {
			msgs[k] = body(now, i >= nWarm)
		}
		if len(msgs) == 1 {
			err = p.Publish(c.topic, msgs[0])
		} else {
			err = p.MultiPublish(c.topic, msgs)
		}
		if err != nil {
			log.Fatal(err)
		}
		i = due
		batches++
	}
	t1 := mono()
	emit("RESULT", map[string]interface{}{
		"n": total - nWarm, "warmup": nWarm, "elapsed": float64(t1-tTimed) / 1e9,
		"cpu": cpuSeconds() - cpu0, "lag_max_ms": float64(lagMax) / 1e6, "batches": batches,
	})
	p.Stop()
}

// pubFed publishes, whenever it reads stdin, one call for the messages read (warm-up and
// timed ones in calls of their own), stamped right before the call.
func pubFed(p *nsq.Producer, topic string) {
	buf := make([]byte, 1<<16)
	var waiting []byte
	var n, nWarm, batches, tTimed int64
	var cpu0 float64
	for {
		k, err := os.Stdin.Read(buf)
		waiting = append(waiting, buf[:k]...)
		for len(waiting) > 0 {
			kind := waiting[0]
			run := 1 // at most 10,000 a call, as drivers/_lat.py's Feed
			for run < len(waiting) && run < 10000 && waiting[run] == kind {
				run++
			}
			waiting = waiting[run:]
			now := mono()
			if kind == 'M' {
				if n == 0 {
					cpu0 = cpuSeconds()
					tTimed = now
				}
				n += int64(run)
			} else {
				nWarm += int64(run)
			}
			msgs := make([][]byte, run)
			for i := range msgs {
				msgs[i] = body(now, kind == 'M')
			}
			var perr error
			if run == 1 {
				perr = p.Publish(topic, msgs[0])
			} else {
				perr = p.MultiPublish(topic, msgs)
			}
			if perr != nil {
				log.Fatal(perr)
			}
			batches++
		}
		if err == io.EOF {
			break
		} else if err != nil {
			log.Fatal(err)
		}
	}
	emit("RESULT", map[string]interface{}{
		"n": n, "warmup": nWarm, "elapsed": float64(mono()-tTimed) / 1e9,
		"cpu": cpuSeconds() - cpu0, "lag_max_ms": nil, "batches": batches,
	})
	p.Stop()
}

func waitStdin() {
	io.Copy(io.Discard, bufio.NewReader(os.Stdin)) // until the runner closes it
}

func sub(args []string) {
	var c common
	fs := flag.NewFlagSet("sub", flag.ExitOnError)
	c.flags(fs)
	out := fs.String("out", "", "file for the latencies (int64 ns, little-endian)")
	fs.Parse(args)
	cons, err := nsq.NewConsumer(c.topic, c.channel, c.config())
	if err != nil {
		log.Fatal(err)
	}
	cons.SetLogger(stderrLog, nsq.LogLevelWarning)
	lat := make([]int64, 0, 1<<20)
	var mu sync.Mutex
	var cpu0 float64
	cons.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		t := mono()
		if m.Body[8] == 'M' {
			mu.Lock()
			if len(lat) == 0 {
				cpu0 = cpuSeconds()
			}
			lat = append(lat, t-int64(binary.BigEndian.Uint64(m.Body)))
			mu.Unlock()
		}
		return nil
	}))
	if err := cons.ConnectToNSQD(c.addr); err != nil {
		log.Fatal(err)
	}
	emit("READY", map[string]interface{}{})
	waitStdin()
	mu.Lock()
	cpu := cpuSeconds() - cpu0
	n := len(lat)
	f, err := os.Create(*out)
	if err != nil {
		log.Fatal(err)
	}
	binary.Write(f, binary.LittleEndian, lat)
	f.Close()
	mu.Unlock()
	emit("RESULT", map[string]interface{}{"n": n, "cpu": cpu})
	os.Exit(0)
}

// ---------------------------------------------------------------- throughput
func tpub(args []string) {
	var c common
	fs := flag.NewFlagSet("tpub", flag.ExitOnError)
	c.flags(fs)
	batch := fs.Int("batch", 200, "messages per MPUB")
	secs := fs.Float64("seconds", 5, "seconds")
	fs.Parse(args)
	p, err := nsq.NewProducer(c.addr, c.config())
	if err != nil {
		log.Fatal(err)
	}
	p.SetLogger(stderrLog, nsq.LogLevelWarning)
	if err := p.Ping(); err != nil {
		log.Fatal(err)
	}
	msgs := make([][]byte, *batch)
	for k := range msgs {
		msgs[k] = body(0, true)
	}
	if err := p.Publish(c.topic, msgs[0]); err != nil { // warm-up
		log.Fatal(err)
	}
	cpu0 := cpuSeconds()
	t0 := time.Now()
	n := 0
	for time.Since(t0).Seconds() < *secs {
		if err := p.MultiPublish(c.topic, msgs); err != nil {
			log.Fatal(err)
		}
		n += *batch
	}
	el := time.Since(t0).Seconds()
	emit("RESULT", map[string]interface{}{
		"n": n, "warmup": 1, "elapsed": el, "rate": float64(n) / el, "cpu": cpuSeconds() - cpu0,
	})
	p.Stop()
}

func tsub(args []string) {
	var c common
	fs := flag.NewFlagSet("tsub", flag.ExitOnError)
	c.flags(fs)
	n := fs.Int64("n", 200000, "messages to consume")
	fs.Parse(args)
	cpu0 := cpuSeconds()
	t0 := time.Now()
	cons, err := nsq.NewConsumer(c.topic, c.channel, c.config())
	if err != nil {
		log.Fatal(err)
	}
	cons.SetLogger(stderrLog, nsq.LogLevelWarning)
	var count int64
	done := make(chan struct{})
	cons.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
		if atomic.AddInt64(&count, 1) == *n {
			close(done)
		}
		return nil
	}))
	if err := cons.ConnectToNSQD(c.addr); err != nil {
		log.Fatal(err)
	}
	<-done
	el := time.Since(t0).Seconds()
	emit("RESULT", map[string]interface{}{
		"n": *n, "warmup": 0, "elapsed": el, "rate": float64(*n) / el, "cpu": cpuSeconds() - cpu0,
	})
	os.Exit(0)
}

// ---------------------------------------------------------------- scale
// The shape of scale_smartnsq.py: STARTING, SUBSCRIBED, then stdin commands load/count/stop.
// go-nsq's Producer is one connection, so "one producer" is one per nsqd, used round-robin.
func scale(args []string) {
	fs := flag.NewFlagSet("scale", flag.ExitOnError)
	lookupd := fs.String("lookupd", "127.0.0.1:4161", "nsqlookupd HTTP address")
	nsqds := fs.String("nsqd", "127.0.0.1:4150", "nsqd TCP addresses, comma-separated")
	topics := fs.Int("topics", 100, "topics (one consumer each)")
	prefix := fs.String("prefix", "scale", "topics are PREFIX_0000, PREFIX_0001, ...")
	rate := fs.Float64("rate", 100, "messages per second per topic")
	fs.Parse(args)
	addrs := strings.Split(*nsqds, ",")
	var handled, published int64
	emit("STARTING", map[string]interface{}{"t": float64(mono()) / 1e9})
	names := make([]string, *topics)
	consumers := make([]*nsq.Consumer, *topics)
	for i := range names {
		names[i] = fmt.Sprintf("%s_%04d", *prefix, i)
		cfg := nsq.NewConfig()
		cfg.MaxInFlight = 200
		cons, err := nsq.NewConsumer(names[i], "c", cfg)
		if err != nil {
			log.Fatal(err)
		}
		cons.SetLogger(stderrLog, nsq.LogLevelWarning)
		cons.AddHandler(nsq.HandlerFunc(func(m *nsq.Message) error {
			atomic.AddInt64(&handled, 1)
			return nil
		}))
		if err := cons.ConnectToNSQLookupd(*lookupd); err != nil {
			log.Fatal(err)
		}
		consumers[i] = cons
	}
	for {
		conns := 0
		for _, c := range consumers {
			conns += c.Stats().Connections
		}
		if conns >= len(consumers)*len(addrs) {
			emit("SUBSCRIBED", map[string]interface{}{"t": float64(mono()) / 1e9, "connections": conns})
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	producers := make([]*nsq.Producer, len(addrs))
	for i, addr := range addrs {
		p, err := nsq.NewProducer(addr, nsq.NewConfig())
		if err != nil {
			log.Fatal(err)
		}
		p.SetLogger(stderrLog, nsq.LogLevelWarning)
		producers[i] = p
	}
	n := int(*rate / 10)
	if n < 1 {
		n = 1
	}
	batch := make([][]byte, n)
	for k := range batch {
		batch[k] = body(0, true)
	}
	started := false
	load := func() {
		// every 0.1 s one MPUB per topic, all topics concurrently (PublishAsync), round-robin
		done := make(chan *nsq.ProducerTransaction, len(names))
		next := 0
		for tick := time.Now(); ; tick = tick.Add(100 * time.Millisecond) {
			for _, t := range names {
				producers[next%len(producers)].MultiPublishAsync(t, batch, done)
				next++
			}
			for range names {
				if tr := <-done; tr.Error != nil {
					log.Fatal(tr.Error)
				}
			}
			atomic.AddInt64(&published, int64(n*len(names)))
			time.Sleep(time.Until(tick.Add(100 * time.Millisecond)))
		}
	}
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		switch strings.TrimSpace(in.Text()) {
		case "load":
			if !started {
				started = true
				go load()
			}
		case "count":
			emit("COUNT", map[string]interface{}{
				"published": atomic.LoadInt64(&published), "handled": atomic.LoadInt64(&handled),
			})
		case "stop":
			os.Exit(0)
		}
	}
	os.Exit(0)
}

func main() {
	initMono()
	if len(os.Args) < 2 {
		log.Fatal("usage: nsqgo pub|sub|tpub|tsub|scale [flags]")
	}
	switch os.Args[1] {
	case "pub":
		pub(os.Args[2:])
	case "sub":
		sub(os.Args[2:])
	case "tpub":
		tpub(os.Args[2:])
	case "tsub":
		tsub(os.Args[2:])
	case "scale":
		scale(os.Args[2:])
	default:
		log.Fatalf("unknown command %q", os.Args[1])
	}
}
