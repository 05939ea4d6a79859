// bf16 for the CPU emulation: round-to-nearest-even conversions and the bf16 operations
// candle's kernels use (each through f32, rounded once, as the device's are).
#pragma once
#include <cstdint>
#include <cstring>
#include <cmath>
struct __nv_bfloat16 { uint16_t x; };
inline float __bfloat162float(__nv_bfloat16 h) { uint32_t u = uint32_t(h.x) << 16; float f; memcpy(&f, &u, 4); return f; }
inline __nv_bfloat16 __float2bfloat16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return {uint16_t((u >> 16) | 0x40)};  // NaN stays NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    return {uint16_t(u >> 16)};
}
inline __nv_bfloat16 operator-(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(__bfloat162float(a) - __bfloat162float(b)); }
inline __nv_bfloat16 hexp(__nv_bfloat16 a) { return __float2bfloat16(std::exp(__bfloat162float(a))); }
inline __nv_bfloat16 __hmul(__nv_bfloat16 a, __nv_bfloat16 b) { return __float2bfloat16(__bfloat162float(a) * __bfloat162float(b)); }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
