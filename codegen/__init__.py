"""Code generation: isl schedule -> C/OpenMP via cgen; toolchain and runtime glue."""
