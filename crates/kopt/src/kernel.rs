//! The definition a `#[kopt::kernel]` expansion embeds, and the per-context state behind
//! the generated launcher: which compiled function runs for a given launch, and why.

use std::ffi::c_void;
use std::fmt;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};

use cudarc::driver::{CudaFunction, CudaStream};
use kopt_spec::expr::{self, Op};
use kopt_spec::tensor_map::TensorMapArgs;
use kopt_spec::KernelSpec;

use crate::compile;
use crate::Error;

/// A device buffer parameter: its name and its length as an expression program.
#[derive(Debug)]
pub struct BufferDef {
    pub name: &'static str,
    pub len: &'static [Op],
}

/// A shape region: the condition over the scalar arguments under which a variant runs.
#[derive(Debug)]
pub struct RegionDef {
    pub text: &'static str,
    pub program: &'static [Op],
}

/// One compilable kernel version: the reference or an accepted variant.
#[derive(Debug)]
pub struct VariantDef {
    /// `reference`, or the variant's name.
    pub id: &'static str,
    /// The architecture the variant was accepted for (`None` for the reference).
    pub arch: Option<&'static str>,
    /// The device it was accepted for (`NVIDIA H200`), when its lock entry names one:
    /// it then runs on that device only, tried before the architecture's variants.
    pub device: Option<&'static str>,
    pub region: Option<RegionDef>,
    /// The self-contained CUDA C++ source.
    pub source: &'static str,
    pub entry: &'static str,
    /// NVRTC options (defines first).
    pub options: &'static [&'static str],
    pub grid: [&'static [Op]; 3],
    pub block: [&'static [Op]; 3],
    pub smem: &'static [Op],
    /// Cluster dimensions set at launch (`None`: none).
    pub cluster: Option<[&'static [Op]; 3]>,
    /// The PTX the variant's verification loaded, when its lock entry has one for this
    /// architecture: loaded through the driver at first launch, without NVRTC.
    pub ptx: Option<PtxDef>,
    /// Its kernel arguments in order, as indices into the launch's pool (the launcher's
    /// parameters, then the computed arguments, then the tensor maps:
    /// `KernelSpec::pool_index`).
    pub args: &'static [u16],
}

/// A variant's verified PTX, embedded at build from its `kernel.ptx`.
#[derive(Debug)]
pub struct PtxDef {
    pub text: &'static str,
    /// The entry's name in the PTX (NVRTC's lowered name of a name expression).
    pub symbol: &'static str,
    /// The NVRTC that compiled it (`13.0`).
    pub nvrtc: &'static str,
}

/// A kernel argument the launcher computes (`args = (.., block_size: i32 = block_x)`):
/// one program per version, since a variant's defines and launch rule change its value.
#[derive(Debug)]
pub struct ComputedArgDef {
    pub name: &'static str,
    /// Its type as the annotation wrote it (`i32`).
    pub ty: &'static str,
    pub reference: &'static [Op],
    /// Aligned with [`KernelDef::variants`].
    pub variants: &'static [&'static [Op]],
}

/// A tensor map of `tensor_maps`: its fields' programs for every version, since a
/// variant's defines change them.
#[derive(Debug)]
pub struct TensorMapDef {
    pub name: &'static str,
    /// The buffer it describes, by index among the kernel's buffers.
    pub buffer: usize,
    pub reference: MapPrograms,
    /// Aligned with [`KernelDef::variants`].
    pub variants: &'static [MapPrograms],
}

/// A tensor map's fields as expression programs (empty `strides` or `element_strides`:
/// the declaration leaves them out).
#[derive(Debug)]
pub struct MapPrograms {
    pub dims: &'static [&'static [Op]],
    pub strides: &'static [&'static [Op]],
    pub box_dims: &'static [&'static [Op]],
    pub element_strides: &'static [&'static [Op]],
}

/// Most arguments a kernel version takes through kopt's launcher.
pub const MAX_KERNEL_ARGS: usize = kopt_spec::spec::MAX_LAUNCH_ARGS;

/// A lock entry the build refused (stale or corrupt), kept so introspection can say why.
#[derive(Debug)]
pub struct UnusableDef {
    pub arch: &'static str,
    pub variant: &'static str,
    pub reason: &'static str,
}

/// Everything the expansion knows about a kernel.
#[derive(Debug)]
pub struct KernelDef {
    pub name: &'static str,
    pub crate_name: &'static str,
    pub spec_json: &'static str,
    pub scalars: &'static [&'static str],
    pub buffers: &'static [BufferDef],
    pub reference: VariantDef,
    /// Usable accepted variants, grouped by architecture in lock order.
    pub variants: &'static [VariantDef],
    pub unusable: &'static [UnusableDef],
}

/// How many CUDA contexts one kernel can be used from (one per GPU is typical).
pub const MAX_CONTEXTS: usize = 32;

/// A kernel declared with `#[kopt::kernel]`: the generated launcher's state, and the
/// introspection API (name, spec, which variant runs for given arguments, and why).
pub struct Kernel {
    def: KernelDef,
    /// The computed kernel arguments, in kernel-argument order (most kernels have none).
    computed: &'static [ComputedArgDef],
    /// The tensor maps a version may take (most kernels have none).
    maps: &'static [TensorMapDef],
    map_cache: crate::tensor_map::Cache,
    spec: OnceLock<KernelSpec>,
    slots: [Slot; MAX_CONTEXTS],
    init: Mutex<()>,
    /// Set when a shadow check found a variant diverging from the reference and
    /// `KOPT_SHADOW_FALLBACK` is on: the reference runs every launch from then on.
    pub(crate) fell_back: AtomicBool,
}

struct Slot {
    /// The `CUcontext` this slot serves, published after `loaded` is set.
    ctx: AtomicUsize,
    loaded: OnceLock<Loaded>,
}

/// The compiled functions of one kernel in one context.
struct Loaded {
    arch: String,
    /// The device's name, as the driver gives it.
    device: String,
    /// Its compute capability.
    cc: (i32, i32),
    /// Compiled by NVRTC at the first launch that needs it, under the kernel's `init`
    /// lock: a process whose launches all run variants with embedded PTX never loads
    /// NVRTC.
    reference: OnceLock<CudaFunction>,
    /// Aligned with `def.variants`: the function where the variant is for this
    /// architecture (and this device, if it names one) and loaded, and how its code got
    /// here; else `None`.
    variants: Vec<Option<(CudaFunction, CodeOrigin)>>,
    /// Indices into `def.variants` in the order they are tried here: those keyed by
    /// this device, then the architecture's, each in lock order.
    order: Vec<usize>,
    /// Variants for this architecture that failed to compile or load here.
    failures: Vec<(&'static str, String)>,
}

/// A resolved launch: the function and its geometry. Produced by [`Kernel::prepare`].
pub struct Launch<'a> {
    function: &'a CudaFunction,
    kernel: &'static str,
    computed: &'static [ComputedArgDef],
    /// The version's arguments as pool indices ([`VariantDef::args`]).
    pub(crate) order: &'static [u16],
    /// The kernel, for what a launch does besides launching ([`crate::observe`]).
    pub(crate) owner: &'static Kernel,
    /// The scalar arguments it was prepared for (floats as 0).
    pub(crate) args: &'a [i64],
    /// The tensor maps evaluated for this version when it was prepared, one slot per
    /// declared map: `Some` for each map the version takes.
    maps: &'a [Option<TensorMapArgs>],
    /// Which version: `None` for the reference, else its index in `KernelDef::variants`.
    pub(crate) version: Option<usize>,
    pub variant: &'static str,
    pub grid: (u32, u32, u32),
    pub block: (u32, u32, u32),
    pub smem: u32,
    /// Thread-block cluster set at launch; `(1, 1, 1)` launches without the attribute.
    pub cluster: (u32, u32, u32),
}

impl Launch<'_> {
    /// Computed kernel argument number `index` for this launch's version, over the scalar
    /// arguments, converted to the kernel's type. Allocation-free.
    #[doc(hidden)]
    pub fn computed<T: TryFrom<i64>>(&self, index: usize, args: &[i64]) -> Result<T, Error> {
        let c = &self.computed[index];
        let program = match self.version {
            None => c.reference,
            Some(i) => c.variants[i],
        };
        let value = expr::eval(program, args).map_err(|e| Error::Expr {
            kernel: self.kernel,
            what: "the computed argument",
            item: c.name,
            error: e,
        })?;
        T::try_from(value).map_err(|_| Error::ComputedArg {
            kernel: self.kernel,
            variant: self.variant,
            arg: c.name,
            ty: c.ty,
            value,
        })
    }

    /// Tensor map number `index` for this launch's version over the buffer at `address`:
    /// from the kernel's cache, else encoded ([`crate::tensor_map`]), from the fields
    /// evaluated when the launch was prepared. A zeroed map when the version does not take
    /// it.
    #[doc(hidden)]
    pub fn tensor_map(
        &self,
        index: usize,
        address: u64,
    ) -> Result<crate::tensor_map::TensorMap, Error> {
        let k = self.owner;
        match &self.maps[index] {
            None => Ok(crate::tensor_map::unused()),
            Some(map) => k
                .map_cache
                .get(self.kernel, index, k.maps[index].name, map, address),
        }
    }

    /// Enqueues the kernel.
    ///
    /// # Safety
    /// `pool` must point to the launch's pool of arguments ([`VariantDef::args`]), each
    /// of the right type, valid until the launch is enqueued; device buffers must be large
    /// enough.
    pub unsafe fn launch(
        &self,
        stream: &CudaStream,
        pool: &mut [*mut c_void],
    ) -> Result<(), Error> {
        stream.context().bind_to_thread().map_err(Error::driver)?;
        match crate::observe::observer()? {
            None => self.enqueue(stream, pool),
            Some(o) => o.launch(self, stream, pool),
        }
    }

    /// Enqueues the kernel alone, with its version's arguments picked from the pool.
    ///
    /// # Safety
    /// As [`Launch::launch`]; the stream's context is current.
    pub(crate) unsafe fn enqueue(
        &self,
        stream: &CudaStream,
        pool: &[*mut c_void],
    ) -> Result<(), Error> {
        let mut params = [std::ptr::null_mut(); MAX_KERNEL_ARGS];
        for (p, &i) in params.iter_mut().zip(self.order) {
            *p = pool[i as usize];
        }
        crate::launch_kernel(
            self.function.cu_function(),
            self.grid,
            self.block,
            self.cluster,
            self.smem,
            stream.cu_stream(),
            &mut params[..self.order.len()],
        )
    }
}

/// How a variant's code came to run in this process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CodeOrigin {
    /// Its verified PTX, embedded at build, loaded through the driver: the bytes its
    /// verification loaded, and no NVRTC.
    VerifiedPtx { nvrtc: &'static str },
    /// Compiled from its source by NVRTC in this process, and why not from verified PTX.
    Compiled { why: String },
}

impl fmt::Display for CodeOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CodeOrigin::VerifiedPtx { nvrtc } => {
                write!(f, "its verified PTX (NVRTC {nvrtc}), loaded by the driver")
            }
            CodeOrigin::Compiled { why } => write!(f, "compiled here by NVRTC: {why}"),
        }
    }
}

/// Loads a variant: its embedded PTX through the driver, else its source through NVRTC.
/// The error says why each failed.
fn load_variant(
    ctx: &std::sync::Arc<cudarc::driver::CudaContext>,
    kernel: &'static str,
    v: &VariantDef,
    cc: (i32, i32),
) -> Result<(CudaFunction, CodeOrigin), String> {
    let why = match &v.ptx {
        None => "no verified PTX is embedded for this architecture".to_string(),
        Some(_) if ignore_ptx() => format!("{IGNORE_PTX} is set"),
        Some(p) => match compile::load_ptx(ctx, kernel, v, p, cc) {
            Ok(f) => return Ok((f, CodeOrigin::VerifiedPtx { nvrtc: p.nvrtc })),
            Err(e) => format!(
                "the driver refused its verified PTX (NVRTC {}): {}",
                p.nvrtc,
                first_line(&e.to_string())
            ),
        },
    };
    match compile::load(ctx, kernel, v, cc) {
        Ok(f) => Ok((f, CodeOrigin::Compiled { why })),
        Err(e) if v.ptx.is_some() => Err(format!("{why}; compiling its source failed too: {e}")),
        Err(e) => Err(e.to_string()),
    }
}

/// The switch that makes launchers compile every variant from its source with NVRTC,
/// ignoring the verified PTX embedded at build (to tell whether a problem is the PTX's).
pub const IGNORE_PTX: &str = "KOPT_IGNORE_PTX";

fn ignore_ptx() -> bool {
    static IGNORE: OnceLock<bool> = OnceLock::new();
    *IGNORE.get_or_init(|| env_flag(IGNORE_PTX))
}

fn env_flag(name: &str) -> bool {
    std::env::var(name)
        .map(|v| !matches!(v.trim(), "" | "0" | "false" | "no" | "off"))
        .unwrap_or(false)
}

/// Whether `KOPT_DISABLE` forces the reference. Read once, at the first launch of the
/// process, so that it costs nothing on the hot path.
pub fn disabled() -> bool {
    static DISABLED: OnceLock<bool> = OnceLock::new();
    *DISABLED.get_or_init(|| env_flag("KOPT_DISABLE"))
}

impl Kernel {
    #[doc(hidden)]
    pub const fn new(def: KernelDef) -> Self {
        Self::with_args(def, &[], &[])
    }

    /// A kernel whose launcher computes some of its arguments, or encodes tensor maps.
    #[doc(hidden)]
    pub const fn with_args(
        def: KernelDef,
        computed: &'static [ComputedArgDef],
        maps: &'static [TensorMapDef],
    ) -> Self {
        Kernel {
            def,
            computed,
            maps,
            map_cache: crate::tensor_map::Cache::new(),
            spec: OnceLock::new(),
            slots: [const {
                Slot {
                    ctx: AtomicUsize::new(0),
                    loaded: OnceLock::new(),
                }
            }; MAX_CONTEXTS],
            init: Mutex::new(()),
            fell_back: AtomicBool::new(false),
        }
    }

    /// The kernel's name (the launcher's name).
    pub fn name(&self) -> &'static str {
        self.def.name
    }

    /// The crate that declares it.
    pub fn crate_name(&self) -> &'static str {
        self.def.crate_name
    }

    /// The embedded definition: reference, usable variants, refused variants.
    pub fn def(&self) -> &KernelDef {
        &self.def
    }

    /// The spec, as the annotation declared it.
    pub fn spec(&self) -> &KernelSpec {
        self.spec.get_or_init(|| {
            serde_json::from_str(self.def.spec_json).expect("the macro embeds a valid spec")
        })
    }

    #[doc(hidden)]
    pub fn check_len(&self, buffer: usize, actual: usize, args: &[i64]) -> Result<(), Error> {
        let b = &self.def.buffers[buffer];
        let need = expr::eval(b.len, args).map_err(|e| Error::Expr {
            kernel: self.def.name,
            what: "the length of",
            item: b.name,
            error: e,
        })?;
        if (actual as i128) < need as i128 {
            return Err(Error::BufferTooShort {
                kernel: self.def.name,
                buffer: b.name,
                expected: need,
                actual,
            });
        }
        Ok(())
    }

    /// Picks the function for this launch (compiling on first use in the stream's
    /// context), computes its geometry and evaluates its tensor maps into `maps` (one slot
    /// per declared map, which the launch then reads: each map is evaluated once).
    /// Allocation-free and lock-free once the context has been seen.
    #[doc(hidden)]
    pub fn prepare<'a>(
        &'static self,
        stream: &CudaStream,
        args: &'a [i64],
        maps: &'a mut [Option<TensorMapArgs>],
    ) -> Result<Launch<'a>, Error> {
        assert_eq!(
            maps.len(),
            self.maps.len(),
            "one slot per declared tensor map"
        );
        let loaded = self.loaded(stream)?;
        let version = self.pick(loaded, args, maps).map(|(i, _, _)| i);
        self.launch_of(stream, loaded, version, args, maps)
    }

    /// The launch of the reference for these arguments, in this stream's context, its
    /// tensor maps evaluated into `maps`.
    pub(crate) fn reference_launch<'a>(
        &'static self,
        stream: &CudaStream,
        args: &'a [i64],
        maps: &'a mut [Option<TensorMapArgs>],
    ) -> Result<Launch<'a>, Error> {
        assert_eq!(
            maps.len(),
            self.maps.len(),
            "one slot per declared tensor map"
        );
        let loaded = self.loaded(stream)?;
        self.launch_of(stream, loaded, None, args, maps)
    }

    /// The launch of `version` (`None`: the reference) for these arguments. `maps` holds
    /// the variant's evaluated maps where [`Self::pick`] chose it; the reference's are
    /// evaluated here.
    fn launch_of<'a>(
        &'static self,
        stream: &CudaStream,
        loaded: &'static Loaded,
        version: Option<usize>,
        args: &'a [i64],
        maps: &'a mut [Option<TensorMapArgs>],
    ) -> Result<Launch<'a>, Error> {
        let (def, function) = match version.and_then(|i| {
            let (f, _) = loaded.variants[i].as_ref()?;
            Some((&self.def.variants[i], f))
        }) {
            Some(found) => found,
            None => {
                self.version_maps(None, args, maps)
                    .map_err(|problem| Error::TensorMap {
                        kernel: self.def.name,
                        problem,
                    })?;
                (&self.def.reference, self.reference(stream, loaded)?)
            }
        };
        let dim = |p: &'static [Op], what: &'static str| -> Result<u32, Error> {
            let v = expr::eval(p, args).map_err(|e| Error::Expr {
                kernel: self.def.name,
                what,
                item: def.id,
                error: e,
            })?;
            u32::try_from(v).map_err(|_| Error::Geometry {
                kernel: self.def.name,
                variant: def.id,
                what,
                value: v,
            })
        };
        let grid = (
            dim(def.grid[0], "grid.x of")?,
            dim(def.grid[1], "grid.y of")?,
            dim(def.grid[2], "grid.z of")?,
        );
        let block = (
            dim(def.block[0], "block.x of")?,
            dim(def.block[1], "block.y of")?,
            dim(def.block[2], "block.z of")?,
        );
        let cluster = match &def.cluster {
            Some(c) => (
                dim(c[0], "cluster.x of")?,
                dim(c[1], "cluster.y of")?,
                dim(c[2], "cluster.z of")?,
            ),
            None => (1, 1, 1),
        };
        for (what, v) in [("grid", grid), ("block", block), ("cluster", cluster)] {
            if v.0 == 0 || v.1 == 0 || v.2 == 0 {
                return Err(Error::Geometry {
                    kernel: self.def.name,
                    variant: def.id,
                    what,
                    value: 0,
                });
            }
        }
        let as_i64 = |v: (u32, u32, u32)| [v.0 as i64, v.1 as i64, v.2 as i64];
        if let Some(problem) = kopt_spec::spec::cluster_problem(as_i64(grid), as_i64(cluster)) {
            return Err(Error::Cluster {
                kernel: self.def.name,
                variant: def.id,
                problem,
            });
        }
        Ok(Launch {
            function,
            kernel: self.def.name,
            computed: self.computed,
            order: def.args,
            owner: self,
            args,
            version: version.filter(|&i| loaded.variants[i].is_some()),
            maps,
            variant: def.id,
            grid,
            block,
            smem: dim(def.smem, "shared memory of")?,
            cluster,
        })
    }

    /// The first loaded variant, in try order, whose region holds and whose tensor maps
    /// encode for `args` (evaluated into `maps`); `None`: the reference.
    fn pick<'a>(
        &'a self,
        loaded: &'a Loaded,
        args: &[i64],
        maps: &mut [Option<TensorMapArgs>],
    ) -> Option<(usize, &'a VariantDef, &'a CudaFunction)> {
        if disabled() || self.fell_back.load(Ordering::Relaxed) {
            return None;
        }
        loaded.order.iter().find_map(|&i| {
            let (def, (f, _)) = (&self.def.variants[i], loaded.variants[i].as_ref()?);
            (region_holds(def, args) && self.version_maps(Some(i), args, maps).is_ok())
                .then_some((i, def, f))
        })
    }

    /// Where the launch's pool holds the first tensor map.
    fn map_pool_base(&self) -> u16 {
        (self.def.buffers.len() + self.def.scalars.len() + self.computed.len()) as u16
    }

    /// Tensor map `index` evaluated for `version` (`None`: the reference) over `args`
    /// and checked, as the engine's worker evaluates it (`KernelSpec::tensor_map_args`).
    pub(crate) fn map_args(
        &self,
        index: usize,
        version: Option<usize>,
        args: &[i64],
    ) -> Result<TensorMapArgs, String> {
        let def = &self.maps[index];
        let programs = match version {
            None => &def.reference,
            Some(i) => &def.variants[i],
        };
        let decl = &self.spec().tensor_maps[index];
        let eval = |ps: &[&'static [Op]], out: &mut [i64; kopt_spec::tensor_map::MAX_RANK]| {
            for (o, p) in out.iter_mut().zip(ps) {
                *o = expr::eval(p, args).map_err(|e| format!("tensor map `{}`: {e}", def.name))?;
            }
            Ok::<usize, String>(ps.len())
        };
        let (mut d, mut s, mut b, mut e) = ([0i64; 5], [0i64; 5], [0i64; 5], [1i64; 5]);
        let rank = eval(programs.dims, &mut d)?;
        let ns = eval(programs.strides, &mut s)?;
        eval(programs.box_dims, &mut b)?;
        eval(programs.element_strides, &mut e)?;
        let buffer = &self.def.buffers[def.buffer];
        let dtype = self
            .spec()
            .buffers()
            .nth(def.buffer)
            .map(|b| b.dtype)
            .expect("the macro embeds the map's buffer");
        let map = TensorMapArgs::new(
            decl,
            def.buffer,
            dtype,
            kopt_spec::tensor_map::Evaluated {
                dims: &d[..rank],
                strides: &s[..ns],
                box_dims: &b[..rank],
                element_strides: &e[..rank],
            },
        )?;
        let len = expr::eval(buffer.len, args).map_err(|e| format!("`{}`: {e}", buffer.name))?;
        map.check_extent(def.name, buffer.name, len.max(0) as u64)?;
        Ok(map)
    }

    /// Evaluates into `maps` (one slot per declared map) the tensor maps that `version`
    /// (`None`: the reference) takes, the others `None`. The error is the first map that
    /// does not encode: a variant then runs where its region holds, and the reference
    /// elsewhere.
    fn version_maps(
        &self,
        version: Option<usize>,
        args: &[i64],
        maps: &mut [Option<TensorMapArgs>],
    ) -> Result<(), String> {
        let base = self.map_pool_base();
        let order = match version {
            None => self.def.reference.args,
            Some(i) => self.def.variants[i].args,
        };
        for (m, slot) in maps.iter_mut().enumerate() {
            *slot = None;
            if order.contains(&(base + m as u16)) {
                *slot = Some(self.map_args(m, version, args)?);
            }
        }
        Ok(())
    }

    /// The reference's function in this context, compiled by NVRTC the first time.
    fn reference<'a>(
        &self,
        stream: &CudaStream,
        loaded: &'a Loaded,
    ) -> Result<&'a CudaFunction, Error> {
        if let Some(f) = loaded.reference.get() {
            return Ok(f);
        }
        self.reference_slow(stream, loaded)
    }

    #[cold]
    fn reference_slow<'a>(
        &self,
        stream: &CudaStream,
        loaded: &'a Loaded,
    ) -> Result<&'a CudaFunction, Error> {
        let _guard = self.init.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(f) = loaded.reference.get() {
            return Ok(f);
        }
        let f = compile::load(
            stream.context(),
            self.def.name,
            &self.def.reference,
            loaded.cc,
        )?;
        Ok(loaded.reference.get_or_init(|| f))
    }

    fn loaded(&self, stream: &CudaStream) -> Result<&Loaded, Error> {
        let key = stream.context().cu_ctx() as usize;
        for slot in &self.slots {
            if slot.ctx.load(Ordering::Acquire) == key {
                if let Some(l) = slot.loaded.get() {
                    return Ok(l);
                }
            }
        }
        self.load_slow(stream, key)
    }

    #[cold]
    fn load_slow(&self, stream: &CudaStream, key: usize) -> Result<&Loaded, Error> {
        let _guard = self.init.lock().unwrap_or_else(|p| p.into_inner());
        for slot in &self.slots {
            if slot.ctx.load(Ordering::Acquire) == key {
                if let Some(l) = slot.loaded.get() {
                    return Ok(l);
                }
            }
        }
        let slot = self
            .slots
            .iter()
            .find(|s| s.ctx.load(Ordering::Acquire) == 0 && s.loaded.get().is_none())
            .ok_or(Error::TooManyContexts {
                kernel: self.def.name,
                max: MAX_CONTEXTS,
            })?;
        let loaded = self.compile_for(stream)?;
        // Only the holder of `init` sets slots, so this cannot be taken already.
        let _ = slot.loaded.set(loaded);
        slot.ctx.store(key, Ordering::Release);
        Ok(slot.loaded.get().expect("just set"))
    }

    fn compile_for(&self, stream: &CudaStream) -> Result<Loaded, Error> {
        let ctx = stream.context();
        let (major, minor) = ctx.compute_capability().map_err(Error::driver)?;
        let arch = kopt_spec::files::arch_name(major as u32, minor as u32);
        // A device whose name the driver cannot give runs its architecture's variants.
        let device = ctx.name().unwrap_or_default();
        let cc = (major, minor);
        let mut variants = Vec::with_capacity(self.def.variants.len());
        let mut failures = Vec::new();
        let order = try_order(self.def.variants, &arch, &device);
        for (i, v) in self.def.variants.iter().enumerate() {
            if !order.contains(&i) || disabled() {
                variants.push(None);
                continue;
            }
            match load_variant(ctx, self.def.name, v, cc) {
                Ok(loaded) => variants.push(Some(loaded)),
                Err(e) => {
                    // A variant that does not load here (another NVRTC, say) must not
                    // take the kernel down: the reference covers its shapes.
                    failures.push((v.id, e));
                    variants.push(None);
                }
            }
        }
        let loaded = Loaded {
            arch,
            device,
            cc,
            reference: OnceLock::new(),
            variants,
            order,
            failures,
        };
        // Without a variant to run, the first launch needs the reference; a kernel with
        // variants compiles it when a launch outside their regions needs it.
        if loaded.variants.iter().all(Option::is_none) {
            let f = compile::load(ctx, self.def.name, &self.def.reference, cc)?;
            let _ = loaded.reference.set(f);
        }
        Ok(loaded)
    }

    /// Which version would run on architecture `arch` (e.g. `sm_90`) for these scalar
    /// arguments (in declaration order, as i64), and why, on a device no lock entry names.
    /// Needs no GPU.
    pub fn explain_for(&self, arch: &str, args: &[i64]) -> Selection {
        self.explain_inner(arch, "", args, None)
    }

    /// [`Kernel::explain_for`] on a device of `arch` named `device` (the driver's name,
    /// `NVIDIA H200`): its own entries are tried first. Needs no GPU.
    pub fn explain_on(&self, arch: &str, device: &str, args: &[i64]) -> Selection {
        self.explain_inner(arch, device, args, None)
    }

    /// Which version runs on this stream's device for these arguments, and why,
    /// including variants that failed to load there and how the chosen one was loaded
    /// (its verified PTX, or compiled from source and why).
    pub fn explain(&self, stream: &CudaStream, args: &[i64]) -> Result<Selection, Error> {
        let loaded = self.loaded(stream)?;
        Ok(self.explain_inner(&loaded.arch, &loaded.device, args, Some(loaded)))
    }

    fn explain_inner(
        &self,
        arch: &str,
        device: &str,
        args: &[i64],
        loaded: Option<&Loaded>,
    ) -> Selection {
        let failures = loaded.map_or(&[][..], |l| &l.failures[..]);
        let reference = |reason| Selection {
            kernel: self.def.name,
            variant: "reference",
            arch: arch.to_string(),
            device: None,
            reason,
            embedded_ptx: None,
            code: None,
        };
        if disabled() {
            return reference(Reason::Disabled);
        }
        if self.fell_back.load(Ordering::Relaxed) {
            return reference(Reason::ShadowFallback);
        }
        let mut missed = Vec::new();
        let mut slots = vec![None; self.maps.len()];
        for i in try_order(self.def.variants, arch, device) {
            let def = &self.def.variants[i];
            if let Some((_, err)) = failures.iter().find(|(id, _)| *id == def.id) {
                missed.push(format!("`{}` cannot run here: {}", def.id, first_line(err)));
                continue;
            }
            let maps = self.version_maps(Some(i), args, &mut slots).err();
            if region_holds(def, args) && maps.is_none() {
                return Selection {
                    kernel: self.def.name,
                    variant: def.id,
                    arch: arch.to_string(),
                    device: def.device,
                    reason: Reason::Accepted {
                        region: def.region.as_ref().map(|r| r.text),
                    },
                    embedded_ptx: def.ptx.as_ref().map(|p| p.nvrtc),
                    code: loaded
                        .and_then(|l| l.variants[i].as_ref())
                        .map(|(_, origin)| origin.clone()),
                };
            }
            if let Some(r) = def.region.as_ref().filter(|_| !region_holds(def, args)) {
                missed.push(format!("`{}` claims only `{}`", def.id, r.text));
            } else if let Some(problem) = maps {
                missed.push(format!("`{}` cannot take its {problem}", def.id));
            }
        }
        for def in self
            .def
            .variants
            .iter()
            .filter(|v| v.arch == Some(arch) && v.device.is_some_and(|d| d != device))
        {
            missed.push(format!(
                "`{}` is for {} only",
                def.id,
                def.device.unwrap_or_default()
            ));
        }
        for u in self
            .def
            .unusable
            .iter()
            .filter(|u| u.arch == arch || u.arch == "*")
        {
            missed.push(if u.arch == "*" {
                u.reason.to_string()
            } else {
                format!("`{}` is {}", u.variant, u.reason)
            });
        }
        if missed.is_empty() {
            reference(Reason::NoVariant)
        } else {
            reference(Reason::NotApplicable(missed))
        }
    }
}

/// The indices of the variants that may run on a device of `arch` named `device`, in the
/// order they are tried: those keyed by the device, then those of the architecture.
/// The rule is `kopt_spec::files::try_group`, the CLI's; `device` is empty when unknown.
fn try_order(variants: &[VariantDef], arch: &str, device: &str) -> Vec<usize> {
    let device = Some(device).filter(|d| !d.is_empty());
    let group = |v: &VariantDef| {
        let entry_arch = v.arch?;
        kopt_spec::files::try_group(entry_arch, v.device, arch, device)
    };
    let of = |g: u8| {
        variants
            .iter()
            .enumerate()
            .filter(move |(_, v)| group(v) == Some(g))
    };
    of(0).chain(of(1)).map(|(i, _)| i).collect()
}

fn first_line(s: &str) -> &str {
    s.lines().next().unwrap_or(s)
}

fn region_holds(def: &VariantDef, args: &[i64]) -> bool {
    match &def.region {
        None => true,
        // A region that cannot be evaluated (division by zero) does not hold.
        Some(r) => matches!(expr::eval(r.program, args), Ok(v) if v != 0),
    }
}

impl fmt::Debug for Kernel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Kernel")
            .field("name", &self.def.name)
            .field("crate", &self.def.crate_name)
            .field(
                "variants",
                &self
                    .def
                    .variants
                    .iter()
                    .map(|v| (v.arch.unwrap_or("?"), v.id))
                    .collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

/// Which version of a kernel runs, and why: for logs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Selection {
    pub kernel: &'static str,
    /// `reference` or the variant's name.
    pub variant: &'static str,
    pub arch: String,
    /// The device the chosen variant's entry is keyed by, if any.
    pub device: Option<&'static str>,
    pub reason: Reason,
    /// The NVRTC version of the chosen variant's embedded verified PTX, if it has one.
    pub embedded_ptx: Option<&'static str>,
    /// How the chosen variant was loaded in this context (`None`: the reference, or an
    /// explanation made without a GPU).
    pub code: Option<CodeOrigin>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reason {
    /// An accepted variant for this architecture whose region (if any) holds.
    Accepted { region: Option<&'static str> },
    /// `KOPT_DISABLE` is set.
    Disabled,
    /// A shadow check found the variant diverging from the reference, and
    /// `KOPT_SHADOW_FALLBACK` made the kernel run the reference for the rest of the process.
    ShadowFallback,
    /// No variant was accepted for this architecture.
    NoVariant,
    /// Variants exist but none applies: each entry says why (region, stale, corrupt,
    /// failed to compile).
    NotApplicable(Vec<String>),
}

impl Selection {
    pub fn is_reference(&self) -> bool {
        self.variant == "reference"
    }

    /// What the chosen entry is keyed by: `sm_90`, or `NVIDIA H200 (sm_90)`.
    pub fn key(&self) -> String {
        kopt_spec::files::key_text(&self.arch, self.device)
    }
}

impl fmt::Display for Selection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reason {
            Reason::Accepted { region } => {
                write!(
                    f,
                    "{}: variant `{}` (accepted for {}",
                    self.kernel,
                    self.variant,
                    self.key()
                )?;
                if let Some(r) = region {
                    write!(f, " where `{r}`")?;
                }
                match (&self.code, self.embedded_ptx) {
                    (Some(code), _) => write!(f, "; {code})"),
                    (None, Some(nvrtc)) => write!(f, "; verified PTX of NVRTC {nvrtc} embedded)"),
                    (None, None) => write!(f, ")"),
                }
            }
            Reason::Disabled => write!(f, "{}: reference (KOPT_DISABLE is set)", self.kernel),
            Reason::ShadowFallback => write!(
                f,
                "{}: reference (a shadow check found the variant diverging from it, and KOPT_SHADOW_FALLBACK is set: see Kernel::shadow_report)",
                self.kernel
            ),
            Reason::NoVariant => write!(
                f,
                "{}: reference (no accepted variant for {})",
                self.kernel, self.arch
            ),
            Reason::NotApplicable(why) => write!(
                f,
                "{}: reference on {} ({})",
                self.kernel,
                self.arch,
                why.join("; ")
            ),
        }
    }
}
