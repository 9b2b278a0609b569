"""The role tests. Those that write the machine's /opt and /etc (the node role's, and
the monitoring role applied with its default paths) take the ``etc_lock`` fixture, which
also puts them in the one ``etc`` group that runs on one worker (tests/conftest.py); the
rest write only under their temporary directories and run beside them."""
