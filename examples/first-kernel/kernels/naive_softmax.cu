// Row softmax, fp32, as a first port writes it: one thread per row, three serial passes
// over the row (max, sum of exponentials, write). Obviously correct and very slow at a
// vocabulary-sized row (8192 rows of 50257: a few hundred milliseconds a launch), which
// is where optimisation starts.
#include <cmath>

extern "C" __global__ void naive_softmax(const float* x, float* y, int rows, int cols) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const float* xr = x + static_cast<long long>(row) * cols;
  float* yr = y + static_cast<long long>(row) * cols;
  float m = -INFINITY;
  for (int c = 0; c < cols; ++c) m = fmaxf(m, xr[c]);
  float s = 0.0f;
  for (int c = 0; c < cols; ++c) s += std::exp(xr[c] - m);
  for (int c = 0; c < cols; ++c) yr[c] = std::exp(xr[c] - m) / s;
}
