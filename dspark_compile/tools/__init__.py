"""Tools over the backend: Ascend GE check, post-pass graph tracing (CLI, inspection, demos
live at the package top level: ``cli``, ``inspection``, ``demo``, ``dspark_demo``)."""
