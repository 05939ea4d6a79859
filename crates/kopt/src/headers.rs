//! Standard headers that real kernels include but NVRTC does not ship.
//!
//! Kernels written for nvcc include `<cmath>`, `<stdint.h>`, `<cfloat>` or `<stdio.h>`;
//! nvcc finds the host compiler's, NVRTC has none and stops at the first one. Each name
//! below is handed to NVRTC as an in-memory header (`nvrtcCreateProgram`'s `headers`),
//! so such a kernel compiles unchanged. What each maps to:
//!
//! | header | maps to |
//! |---|---|
//! | `cstdint`, `stdint.h` | libcu++'s `<cuda/std/cstdint>` (fixed-width types in the global namespace, `std::` aliases for `cstdint`); plain typedefs where libcu++ is absent |
//! | `cmath`, `math.h` | NVRTC's built-in math functions (`sqrtf`, `expf`, ...) plus libcu++'s `<cuda/std/cmath>` (`INFINITY`, `NAN`, overloads) with `std::` aliases for the usual functions; `HUGE_VAL(F)` |
//! | `limits` | `<cuda/std/limits>`, `std::numeric_limits` an alias of `cuda::std::numeric_limits` |
//! | `climits`, `limits.h` | `<cuda/std/climits>` (`INT_MAX`, `CHAR_BIT`, ...) |
//! | `cfloat`, `float.h` | `FLT_*` and `DBL_*` constants (IEEE-754 binary32/64 values) |
//! | `cstdio`, `stdio.h` | nothing to add: device `printf` is an NVRTC built-in (`std::printf` for `cstdio`) |
//! | `cassert`, `assert.h` | nothing to add: device `assert` is an NVRTC built-in |
//! | `cstddef`, `stddef.h` | `<cuda/std/cstddef>` (`size_t` is built in; `ptrdiff_t`, `std::size_t`) |
//!
//! A header of the same name in the kernel's own folders or include paths is not
//! shadowed for quoted includes: the crate's headers are inlined before NVRTC sees the
//! source. The text is part of what is compiled, so [`SHIMS_VERSION`] goes into every
//! cache key that covers a compile.

/// Bumped whenever a shim's text changes (part of compile cache keys).
pub const SHIMS_VERSION: u32 = 1;

const STDINT_H: &str = r#"#pragma once
#if __has_include(<cuda/std/cstdint>)
#include <cuda/std/cstdint>
#else
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
typedef long long intptr_t;
typedef unsigned long long uintptr_t;
typedef long long intmax_t;
typedef unsigned long long uintmax_t;
#define INT8_MIN (-128)
#define INT16_MIN (-32767 - 1)
#define INT32_MIN (-2147483647 - 1)
#define INT64_MIN (-9223372036854775807LL - 1)
#define INT8_MAX 127
#define INT16_MAX 32767
#define INT32_MAX 2147483647
#define INT64_MAX 9223372036854775807LL
#define UINT8_MAX 255
#define UINT16_MAX 65535
#define UINT32_MAX 0xffffffffU
#define UINT64_MAX 0xffffffffffffffffULL
#endif
"#;

const CSTDINT: &str = r#"#pragma once
#include <stdint.h>
namespace std {
using ::int8_t; using ::int16_t; using ::int32_t; using ::int64_t;
using ::uint8_t; using ::uint16_t; using ::uint32_t; using ::uint64_t;
using ::intptr_t; using ::uintptr_t; using ::intmax_t; using ::uintmax_t;
}
"#;

const MATH_H: &str = r#"#pragma once
#if __has_include(<cuda/std/cmath>)
#include <cuda/std/cmath>
#endif
#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef HUGE_VALF
#define HUGE_VALF __int_as_float(0x7f800000)
#endif
#ifndef HUGE_VAL
#define HUGE_VAL __longlong_as_double(0x7ff0000000000000LL)
#endif
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif
"#;

// `std::` overloads over NVRTC's built-in C functions (`sqrtf` for float, `sqrt` for
// double), so they exist whichever libcu++ a toolkit ships.
const CMATH: &str = r#"#pragma once
#include <math.h>
#define KOPT_STD_MATH1(F) \
  static __host__ __device__ __forceinline__ float F(float x) { return ::F##f(x); } \
  static __host__ __device__ __forceinline__ double F(double x) { return ::F(x); }
#define KOPT_STD_MATH2(F) \
  static __host__ __device__ __forceinline__ float F(float x, float y) { return ::F##f(x, y); } \
  static __host__ __device__ __forceinline__ double F(double x, double y) { return ::F(x, y); }
namespace std {
KOPT_STD_MATH1(fabs) KOPT_STD_MATH1(sqrt) KOPT_STD_MATH1(cbrt) KOPT_STD_MATH1(exp)
KOPT_STD_MATH1(exp2) KOPT_STD_MATH1(expm1) KOPT_STD_MATH1(log) KOPT_STD_MATH1(log2)
KOPT_STD_MATH1(log10) KOPT_STD_MATH1(log1p) KOPT_STD_MATH1(sin) KOPT_STD_MATH1(cos)
KOPT_STD_MATH1(tan) KOPT_STD_MATH1(asin) KOPT_STD_MATH1(acos) KOPT_STD_MATH1(atan)
KOPT_STD_MATH1(sinh) KOPT_STD_MATH1(cosh) KOPT_STD_MATH1(tanh) KOPT_STD_MATH1(erf)
KOPT_STD_MATH1(erfc) KOPT_STD_MATH1(tgamma) KOPT_STD_MATH1(lgamma) KOPT_STD_MATH1(floor)
KOPT_STD_MATH1(ceil) KOPT_STD_MATH1(round) KOPT_STD_MATH1(trunc)
KOPT_STD_MATH2(pow) KOPT_STD_MATH2(atan2) KOPT_STD_MATH2(hypot) KOPT_STD_MATH2(fmod)
KOPT_STD_MATH2(fmin) KOPT_STD_MATH2(fmax) KOPT_STD_MATH2(copysign)
static __host__ __device__ __forceinline__ float abs(float x) { return ::fabsf(x); }
static __host__ __device__ __forceinline__ double abs(double x) { return ::fabs(x); }
static __host__ __device__ __forceinline__ int abs(int x) { return ::abs(x); }
static __host__ __device__ __forceinline__ long long abs(long long x) { return ::llabs(x); }
static __host__ __device__ __forceinline__ float fma(float x, float y, float z) { return ::fmaf(x, y, z); }
static __host__ __device__ __forceinline__ double fma(double x, double y, double z) { return ::fma(x, y, z); }
static __host__ __device__ __forceinline__ bool isnan(float x) { return ::isnan(x); }
static __host__ __device__ __forceinline__ bool isnan(double x) { return ::isnan(x); }
static __host__ __device__ __forceinline__ bool isinf(float x) { return ::isinf(x); }
static __host__ __device__ __forceinline__ bool isinf(double x) { return ::isinf(x); }
static __host__ __device__ __forceinline__ bool isfinite(float x) { return ::isfinite(x); }
static __host__ __device__ __forceinline__ bool isfinite(double x) { return ::isfinite(x); }
static __host__ __device__ __forceinline__ bool signbit(float x) { return ::signbit(x); }
static __host__ __device__ __forceinline__ bool signbit(double x) { return ::signbit(x); }
}
#undef KOPT_STD_MATH1
#undef KOPT_STD_MATH2
"#;

const LIMITS: &str = r#"#pragma once
#if __has_include(<cuda/std/limits>)
#include <cuda/std/limits>
namespace std { using cuda::std::numeric_limits; }
#else
#error "kopt maps <limits> to libcu++'s <cuda/std/limits>, which is not in the include path: point CUDA_HOME (or KOPT_CUDA_INCLUDE) at a CUDA 12 or 13 toolkit"
#endif
"#;

const CLIMITS: &str = r#"#pragma once
#if __has_include(<cuda/std/climits>)
#include <cuda/std/climits>
#else
#define CHAR_BIT 8
#define SCHAR_MIN (-128)
#define SCHAR_MAX 127
#define UCHAR_MAX 255
#define SHRT_MIN (-32768)
#define SHRT_MAX 32767
#define USHRT_MAX 65535
#define INT_MIN (-INT_MAX - 1)
#define INT_MAX 0x7fffffff
#define UINT_MAX 0xffffffffU
#define LLONG_MIN (-LLONG_MAX - 1LL)
#define LLONG_MAX 0x7fffffffffffffffLL
#define ULLONG_MAX 0xffffffffffffffffULL
#endif
"#;

const CFLOAT: &str = r#"#pragma once
#define FLT_RADIX 2
#define FLT_MANT_DIG 24
#define FLT_DIG 6
#define FLT_MIN_EXP (-125)
#define FLT_MAX_EXP 128
#define FLT_MAX 3.40282346638528859812e+38F
#define FLT_MIN 1.17549435082228750797e-38F
#define FLT_EPSILON 1.1920928955078125e-07F
#define FLT_TRUE_MIN 1.40129846432481707092e-45F
#define DBL_MANT_DIG 53
#define DBL_DIG 15
#define DBL_MIN_EXP (-1021)
#define DBL_MAX_EXP 1024
#define DBL_MAX 1.79769313486231570815e+308
#define DBL_MIN 2.22507385850720138309e-308
#define DBL_EPSILON 2.22044604925031308085e-16
#define DBL_TRUE_MIN 4.94065645841246544177e-324
"#;

const CSTDIO: &str = r#"#pragma once
namespace std { using ::printf; }
"#;

const STDIO_H: &str = "#pragma once\n";
const ASSERT_H: &str = "#pragma once\n";

const CSTDDEF: &str = r#"#pragma once
#if __has_include(<cuda/std/cstddef>)
#include <cuda/std/cstddef>
#endif
namespace std { using ::size_t; }
"#;

/// Every shim: `(name as included, text)`, in a fixed order. The C++ forms include the
/// C ones (themselves shims) and add the `std::` names.
pub const STD_HEADER_SHIMS: &[(&str, &str)] = &[
    ("stdint.h", STDINT_H),
    ("cstdint", CSTDINT),
    ("math.h", MATH_H),
    ("cmath", CMATH),
    ("limits", LIMITS),
    ("climits", CLIMITS),
    ("limits.h", CLIMITS),
    ("cfloat", CFLOAT),
    ("float.h", CFLOAT),
    ("cstdio", CSTDIO),
    ("stdio.h", STDIO_H),
    ("cassert", ASSERT_H),
    ("assert.h", ASSERT_H),
    ("cstddef", CSTDDEF),
    ("stddef.h", CSTDDEF),
];
