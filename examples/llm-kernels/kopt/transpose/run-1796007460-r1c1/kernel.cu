// Transpose, fp32: out[c][r] = in[r][c]. 64x64 tiles through shared memory, THREADS a block.
// When rows and cols are multiples of 4, every global access is a 16-byte float4, and a
// warp's access covers 4 rows x 128 contiguous bytes (fully used lines) on both sides:
// - load: lane l reads row r0 + l/8, columns c0 + 4*(l%8) .. +3, and writes them to the
//   tile as 4 scalars;
// - store: lane l gathers input rows 4*(l%8) .. +3 of input column l/8 (4 scalar tile
//   reads) and writes them as one float4 of the output, with st.global.cs (streaming:
//   the output is never read again, so its lines are the first L2 evicts).
// The tile's row pitch is 65 floats: bank(r, c) = (r + c) % 32, so both the writes
// (r + 4*(l%8) + j + l/8 over the warp) and the reads (4*(l%8) + j + l/8) hit 32
// distinct banks. A block has 16 KB of loads in flight (see THREADS).
// Partial tiles need no special case: with rows, cols % 4 == 0 a float4 is wholly in or
// out of bounds. Otherwise, a scalar path over the same tile (any shape).
// The grid is one-dimensional (TILES tiles per block, any number of tiles); ORDER picks
// which tiles run side by side (about 1056 blocks are resident at once: 8 per SM):
// 0: tile columns first (the previous order): the resident blocks read whole input rows
//    but write each output row in 2 KB pieces (8 tile rows x 256 bytes) 32 KB apart;
// 1: tile rows first: the mirror image (whole output rows, 2 KB pieces of input rows);
// 2: bands of GROUP tile rows, tile rows first within a band: at GROUP = 32 the resident
//    blocks cover about 32 x 33 tiles, 8 KB contiguous per input row and per output row,
//    so that both the reads and the writes stay within few DRAM pages at a time.
// TILES: tiles per block (the launch rule's grid is ceil_div(tile count, TILES)), in the
// order above. A block issues the loads of its next tile right after the barrier that
// publishes the current one, so they are in flight while the current tile is read back
// from shared memory and stored: the loads of one tile overlap the stores of the previous,
// where with one tile a block only starts loading once a block before it has retired.
// At TILES = 4, 16384x1024 (4096 tiles) is 1024 blocks: one wave of resident blocks (about
// 1056), no tail. TILES = 1 does what the one-tile kernel did.
#define TILE 64
#define PITCH (TILE + 1)
// Threads per block (the launch rule's block): 64, 128, 256 or 512. A tile is 32 warp-chunks
// of 4 rows x 32 columns; each warp takes CHUNKS of them, so each thread has CHUNKS
// float4 loads (16 * CHUNKS bytes) in flight, 16 KB per block whatever THREADS is. Fewer
// threads a block means more blocks resident per SM (shared memory allows 13 of 16.6 KB):
// 64 or 128 threads, up to 13 blocks (208 KB of loads in flight per SM) where registers
// allow; 256 threads, 8 blocks (the thread limit: 128 KB).
#ifndef THREADS
#define THREADS 256
#endif
// Blocks per SM the compiler must leave registers for (__launch_bounds__'s second
// argument): at 128 threads, 12 blocks cap a thread at 42 registers.
#ifndef MIN_BLOCKS
#define MIN_BLOCKS 1
#endif
#define WARPS (THREADS / 32)
#define CHUNKS (32 / WARPS)
#ifndef ORDER
#define ORDER 2
#endif
#ifndef GROUP
#define GROUP 32
#endif
#ifndef TILES
#define TILES 1
#endif

__device__ __forceinline__ void store_cs(float4* p, float4 v) {
    asm volatile("st.global.cs.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(__float_as_uint(v.x)),
                 "r"(__float_as_uint(v.y)), "r"(__float_as_uint(v.z)), "r"(__float_as_uint(v.w))
                 : "memory");
}

// Tile `i`'s row and column of tiles, in the ORDER above.
__device__ __forceinline__ void tile_at(unsigned int i, unsigned int tiles_r,
                                        unsigned int tiles_c, unsigned int& tr,
                                        unsigned int& tc) {
#if ORDER == 0
    tr = i / tiles_c;
    tc = i % tiles_c;
#elif ORDER == 1
    tr = i % tiles_r;
    tc = i / tiles_r;
#else
    // Band `band` holds band_rows * tiles_c tiles (the last band may be shorter).
    const unsigned int band = i / (GROUP * tiles_c);
    const unsigned int in_band = i % (GROUP * tiles_c);
    const unsigned int band_rows = min((unsigned int)GROUP, tiles_r - band * GROUP);
    tr = band * GROUP + in_band % band_rows;
    tc = in_band / band_rows;
#endif
}

// Vector path: warp w's share of a tile is the CHUNKS warp-chunks w + WARPS*i (4 rows x
// 32 columns each) of the tile starting at (r0, c0).
__device__ __forceinline__ void load_tile(const float* __restrict__ in, unsigned int rows,
                                          unsigned int cols, unsigned int r0, unsigned int c0,
                                          unsigned int warp, unsigned int lane, float4 (&v)[CHUNKS]) {
#pragma unroll
    for (int i = 0; i < CHUNKS; ++i) {
        const unsigned int q = warp + WARPS * i;
        const unsigned int r = (q >> 1) * 4 + (lane >> 3);
        const unsigned int c = (q & 1) * 32 + (lane & 7) * 4;
        if (r0 + r < rows && c0 + c < cols)
            v[i] = __ldg(reinterpret_cast<const float4*>(in + (size_t)(r0 + r) * cols + c0 + c));
    }
}

extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)
transpose_f32(const float* __restrict__ in, float* __restrict__ out, unsigned int rows,
              unsigned int cols) {
    __shared__ float tile[TILE * PITCH];
    const unsigned int tiles_r = (rows + TILE - 1) / TILE, tiles_c = (cols + TILE - 1) / TILE;
    const unsigned int tiles = tiles_r * tiles_c;
    const unsigned int first = blockIdx.x * TILES;
    if (first >= tiles) return;  // no barrier has been reached yet
    const unsigned int end = min(first + TILES, tiles);  // the same for the whole block
    const unsigned int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    unsigned int tr, tc;
    tile_at(first, tiles_r, tiles_c, tr, tc);
    if (((rows | cols) & 3u) == 0) {
        float4 v[CHUNKS];
        load_tile(in, rows, cols, tr * TILE, tc * TILE, warp, lane, v);
        for (unsigned int t = first; t < end; ++t) {
            const unsigned int r0 = tr * TILE;  // input rows of this tile
            const unsigned int c0 = tc * TILE;  // input columns of this tile
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                const unsigned int q = warp + WARPS * i;
                const unsigned int r = (q >> 1) * 4 + (lane >> 3);
                const unsigned int c = (q & 1) * 32 + (lane & 7) * 4;
                if (r0 + r < rows && c0 + c < cols) {
                    float* p = tile + r * PITCH + c;
                    p[0] = v[i].x;
                    p[1] = v[i].y;
                    p[2] = v[i].z;
                    p[3] = v[i].w;
                }
            }
            __syncthreads();
            // The next tile's loads go out now, into registers this tile no longer needs.
            if (t + 1 < end) {
                tile_at(t + 1, tiles_r, tiles_c, tr, tc);
                load_tile(in, rows, cols, tr * TILE, tc * TILE, warp, lane, v);
            }
            // Output tile: 64 output rows (input columns c0..) x 64 output columns (input
            // rows r0..).
#pragma unroll
            for (int i = 0; i < CHUNKS; ++i) {
                const unsigned int q = warp + WARPS * i;
                const unsigned int cc = (q >> 1) * 4 + (lane >> 3);     // input column in tile
                const unsigned int rr = (q & 1) * 32 + (lane & 7) * 4;  // first input row in tile
                if (c0 + cc < cols && r0 + rr < rows) {
                    float4 o;
                    o.x = tile[(rr + 0) * PITCH + cc];
                    o.y = tile[(rr + 1) * PITCH + cc];
                    o.z = tile[(rr + 2) * PITCH + cc];
                    o.w = tile[(rr + 3) * PITCH + cc];
                    store_cs(reinterpret_cast<float4*>(out + (size_t)(c0 + cc) * rows + r0 + rr), o);
                }
            }
            // The tile is overwritten by the next iteration: every read of it comes first.
            if (t + 1 < end) __syncthreads();
        }
    } else {
        // Scalar: lane walks 32 consecutive columns (then rows on the way out), coalesced.
        for (unsigned int t = first; t < end; ++t) {
            tile_at(t, tiles_r, tiles_c, tr, tc);
            const unsigned int r0 = tr * TILE, c0 = tc * TILE;
            for (unsigned int e = threadIdx.x; e < TILE * TILE; e += THREADS) {
                const unsigned int r = e / TILE, c = e % TILE;
                if (r0 + r < rows && c0 + c < cols) tile[r * PITCH + c] = in[(size_t)(r0 + r) * cols + c0 + c];
            }
            __syncthreads();
            for (unsigned int e = threadIdx.x; e < TILE * TILE; e += THREADS) {
                const unsigned int cc = e / TILE, rr = e % TILE;
                if (c0 + cc < cols && r0 + rr < rows) out[(size_t)(c0 + cc) * rows + r0 + rr] = tile[rr * PITCH + cc];
            }
            __syncthreads();
        }
    }
}
