// Block reductions over `block_size` threads (a multiple of 32, at most 1024): a warp
// reduction with cooperative groups, then one value per warp through shared memory.
#pragma once
#include <cooperative_groups.h>
#include <cooperative_groups/reduce.h>
#include <cuda/std/limits>
#include <cmath>
#include "compatibility.cuh"

namespace cg = cooperative_groups;

__device__ __forceinline__ float neg_inf() { return -cuda::std::numeric_limits<float>::infinity(); }

template <typename Op>
__device__ float block_reduce(float v, const int block_size, float identity, Op op) {
  __shared__ float partial[32];
  cg::thread_block block = cg::this_thread_block();
  cg::thread_block_tile<32> warp = cg::tiled_partition<32>(block);
  v = cg::reduce(warp, v, op);
  const int nwarps = block_size / 32;
  if (nwarps == 1) return v;
  if (warp.thread_rank() == 0) partial[warp.meta_group_rank()] = v;
  block.sync();
  v = warp.thread_rank() < nwarps ? partial[warp.thread_rank()] : identity;
  v = cg::reduce(warp, v, op);
  block.sync();  // `partial` is reused by the next reduction
  return v;
}

__device__ __forceinline__ float block_max(float v, const int block_size) {
  return block_reduce(v, block_size, neg_inf(), cg::greater<float>());
}

__device__ __forceinline__ float block_sum(float v, const int block_size) {
  return block_reduce(v, block_size, 0.0f, cg::plus<float>());
}
