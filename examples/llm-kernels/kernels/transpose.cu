// Matrix transpose, fp32: out[c][r] = in[r][c] for a rows x cols input. The tiled
// shared-memory transpose of NVIDIA's "An Efficient Matrix Transpose in CUDA C/C++":
// 32x32 tiles, a 32x8 block (each thread moves 4 elements), the tile padded by one column
// so that the column-wise reads hit 32 different banks. Reads and writes are coalesced,
// 4 bytes per thread per access. Edge tiles are bounds-checked, so any shape works.
#define TILE_DIM 32
#define BLOCK_ROWS 8

extern "C" __global__ void transpose_f32(const float* __restrict__ in, float* __restrict__ out,
                                         unsigned int rows, unsigned int cols) {
    __shared__ float tile[TILE_DIM][TILE_DIM + 1];
    unsigned int c = blockIdx.x * TILE_DIM + threadIdx.x;
    unsigned int r = blockIdx.y * TILE_DIM + threadIdx.y;
    for (unsigned int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
        if (r + j < rows && c < cols) tile[threadIdx.y + j][threadIdx.x] = in[(size_t)(r + j) * cols + c];
    __syncthreads();
    // Transposed block: threadIdx.x now walks the input rows, i.e. the output's columns.
    c = blockIdx.y * TILE_DIM + threadIdx.x;
    r = blockIdx.x * TILE_DIM + threadIdx.y;
    for (unsigned int j = 0; j < TILE_DIM; j += BLOCK_ROWS)
        if (r + j < cols && c < rows) out[(size_t)(r + j) * rows + c] = tile[threadIdx.x][threadIdx.y + j];
}
