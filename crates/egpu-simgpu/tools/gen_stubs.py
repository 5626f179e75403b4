#!/usr/bin/env python3
"""Regenerate src/ffi/stubs.rs: every ELF name in src/procaddr/table.rs that
src/ffi/cuda.rs does not export becomes a NOT_SUPPORTED stub.

Usage (from crates/egpu-simgpu): tools/gen_stubs.py
"""
import re

cuda = open('src/ffi/cuda.rs').read()
impl = set(re.findall(r'^\s+(cu\w+)\(', cuda, re.M))
legacy = set(re.findall(r'\b(cu\w+)\b', cuda.split('mod legacy32')[1]))
table = re.findall(r'\("cu\w+", \d+, \w+, "(cu\w+)"\)', open('src/procaddr/table.rs').read())
missing = sorted(set(table) - impl - legacy)
out = ["//! Every other entry point of the CUDA 12.x driver (all names in the",
       "//! proc-address table that the simulator does not implement): exported so",
       "//! `dlsym` and `cuGetProcAddress` find them; each logs once and returns",
       "//! `CUDA_ERROR_NOT_SUPPORTED`. Regenerate with tools/gen_stubs.py.", "",
       "super::cu_stubs!("] + [f"    {m}," for m in missing] + [");"]
open('src/ffi/stubs.rs', 'w').write("\n".join(out) + "\n")
