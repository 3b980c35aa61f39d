pytest_plugins = ["compat.pytest_plugin", "pytester"]
