"""Tools over the backend: the command line (``cli``), inspection, the demos, the Ascend GE
check and post-pass graph tracing."""
