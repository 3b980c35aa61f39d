from smartnsq.ordered import OrderChecker


def test_increasing_and_redelivery_are_fine():
    c = OrderChecker()
    assert c.check(1, 0)
    assert c.check(1, 0)  # redelivery of the same message
    assert c.check(2, 36)
    assert c.violations == 0


def test_backwards_id_or_offset_is_a_violation():
    c = OrderChecker()
    assert c.check(5, 100)
    assert not c.check(4, 200)
    assert not c.check(6, 50)
    assert c.violations == 2
    assert (c.last_id, c.last_offset) == (5, 100)  # violations do not move the watermark
    assert c.check(6, 136)
