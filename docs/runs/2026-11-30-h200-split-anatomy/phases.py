#!/usr/bin/env python3
# Writes a copy of agents/softmax.cu (argv[1], as of the split-mode template) to argv[2] with phase stamps: clock64 at the
# split path's phase boundaries and %globaltimer at entry and exit, stored by thread 0 of
# each block into g_phase (8 slots a block), and read_phases() to copy them to the host.
import sys
s = open(sys.argv[1]).read()
def after(anchor, text):
    global s
    assert s.count(anchor) == 1, anchor
    s = s.replace(anchor, anchor + text)
def before(anchor, text):
    global s
    assert s.count(anchor) == 1, anchor
    s = s.replace(anchor, text + anchor)
gt = 'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(g));'
after("    const unsigned int tid = threadIdx.x, bs = blockDim.x;\n",
      "    long long g0; { long long g; " + gt + " g0 = g; }\n    const long long p0 = clock64();\n")
after("    const float cache_max = m;  // what the REUSE cache is relative to\n",
      "    const long long p1 = clock64();\n")
before("    float2 st = block_stats;\n", "    const long long p2 = clock64();\n")
after("    m = st.x;\n", "    const long long p3 = clock64();\n")
before("    if (split) cluster_wait();\n", "    const long long p4 = clock64();\n")
after("    if (split) cluster_wait();\n",
      "    if (threadIdx.x == 0) {\n        long long g; " + gt + "\n"
      "        long long* o = g_phase + blockIdx.x * 8;\n"
      "        o[0] = p1 - p0; o[1] = p2 - p1; o[2] = p3 - p2; o[3] = p4 - p3;\n"
      "        o[4] = clock64() - p4; o[5] = g0; o[6] = g;\n    }\n")
s = "__device__ long long g_phase[1024 * 8];\n" + s
s += '\nextern "C" void read_phases(long long* host, int n) {\n' \
     '    cudaMemcpyFromSymbol(host, g_phase, n * sizeof(long long));\n}\n'
open(sys.argv[2], "w").write(s)
