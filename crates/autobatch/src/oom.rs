//! Recognizing out-of-memory errors among everything a candle step can return.

use candle_core::Error as CandleError;

/// The CUDA driver's out-of-memory code, cuBLAS's and cuRAND's allocation
/// failures, as they appear in the text of candle's errors (cudarc prints the
/// enum names).
const OOM_CODES: [&str; 3] =
    ["CUDA_ERROR_OUT_OF_MEMORY", "CUBLAS_STATUS_ALLOC_FAILED", "CURAND_STATUS_ALLOCATION_FAILED"];

/// cuBLAS's execution failure: what a kernel loaded lazily at a new shape
/// reports when it cannot get its memory, and also what a real fault reports.
const MAYBE_OOM_CODES: [&str; 1] = ["CUBLAS_STATUS_EXECUTION_FAILED"];

/// Whether a workload's error means the device ran out of memory.
///
/// Recognizes the CUDA driver's `CUDA_ERROR_OUT_OF_MEMORY` (also when raised
/// while loading a kernel module), cuBLAS's `CUBLAS_STATUS_ALLOC_FAILED` and
/// cuRAND's `CURAND_STATUS_ALLOCATION_FAILED` (a dropout mask's generator),
/// however candle wraps them: `Error::Cuda`, `Context`, `WithBacktrace`,
/// `WithPath`, `Wrapped`, `WrappedContext`, and errors turned into text
/// (`Msg`). The typed value is looked at first (with the `cuda` feature), its
/// text and source chain otherwise: some candle paths (`synchronize`) wrap the
/// driver error in a way that only the text survives. Nothing else counts: a
/// shape error, an illegal address, a cuBLAS execution failure or the word
/// "memory" in a message are not out-of-memory. (The tuner counts a cuBLAS
/// execution failure as out of memory only where the same step ran at a
/// smaller batch: see [`may_be_oom`].)
///
/// ```
/// use autobatch::is_oom;
/// use candle_core::Error;
///
/// let oom = Error::wrap("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")").context("matmul");
/// assert!(is_oom(&oom));
/// assert!(!is_oom(&Error::Msg("shape mismatch in matmul".into())));
/// ```
pub fn is_oom(err: &CandleError) -> bool {
    match err {
        CandleError::Context { inner, .. }
        | CandleError::WithBacktrace { inner, .. }
        | CandleError::WithPath { inner, .. } => is_oom(inner),
        CandleError::Cuda(source) => source_is_oom(source.as_ref()),
        CandleError::WrappedContext { wrapped, .. } => source_is_oom(wrapped.as_ref()),
        CandleError::Wrapped(display) => text_is_oom(&display.to_string()),
        CandleError::Msg(text) => text_is_oom(text),
        _ => false,
    }
}

/// Whether a step's error may be the device running out of memory without
/// saying so: cuBLAS's `CUBLAS_STATUS_EXECUTION_FAILED`, which a kernel
/// loaded lazily at a new, larger shape reports when it cannot get memory
/// (and which a real fault reports too). The tuner counts it as out of
/// memory only at a batch above one the same step already ran at, where the
/// kernels are the same and only the memory grew; anywhere else it is an error.
///
/// ```
/// use autobatch::may_be_oom;
/// use candle_core::Error;
///
/// assert!(may_be_oom(&Error::Msg("CublasError(CUBLAS_STATUS_EXECUTION_FAILED)".into())));
/// assert!(!may_be_oom(&Error::Msg("shape mismatch".into())));
/// ```
pub fn may_be_oom(err: &CandleError) -> bool {
    is_oom(err) || error_text_matches(err, &MAYBE_OOM_CODES)
}

/// Whether a meter's error (a synchronize after the step, a peak read) is
/// the device running out of memory: an asynchronous failure can surface
/// there after the step itself returned.
pub(crate) fn meter_error_is_oom(err: &crate::Error) -> bool {
    match err {
        crate::Error::Meter(source) => source_is_oom(source.as_ref()),
        crate::Error::Candle(source) => is_oom(source),
        _ => false,
    }
}

fn error_text_matches(err: &CandleError, codes: &[&str]) -> bool {
    let mut next: Option<&(dyn std::error::Error + 'static)> = Some(without_backtrace(err));
    while let Some(err) = next {
        let text = match err.downcast_ref::<CandleError>() {
            Some(candle) => text_without_backtraces(candle),
            None => err.to_string(),
        };
        if codes.iter().any(|code| text.contains(code)) {
            return true;
        }
        next = err.source();
    }
    false
}

/// The error under its backtrace layers.
fn without_backtrace(mut err: &CandleError) -> &CandleError {
    while let CandleError::WithBacktrace { inner, .. } = err {
        err = inner;
    }
    err
}

/// An error's text with every captured backtrace left out
/// ([`candle_message`](crate::error::candle_message)), and the debug form of what lies
/// under candle's wrappers (not every one chains its source). Printing a
/// backtrace symbolizes it: with `RUST_BACKTRACE` set, that loads the binary's
/// debug information onto the heap for the rest of the process (tens of MiB),
/// which a heap meter would count in every later trial.
fn text_without_backtraces(err: &CandleError) -> String {
    let mut innermost = err;
    while let CandleError::WithBacktrace { inner, .. }
    | CandleError::Context { inner, .. }
    | CandleError::WithPath { inner, .. } = innermost
    {
        innermost = inner;
    }
    format!("{}\n{innermost:?}", crate::error::candle_message(err))
}

fn source_is_oom(err: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(candle) = err.downcast_ref::<CandleError>() {
            return is_oom(candle);
        }
        #[cfg(feature = "cuda")]
        if let Some(cuda) = err.downcast_ref::<candle_core::cuda_backend::CudaError>() {
            return cuda_error_is_oom(cuda);
        }
        #[cfg(feature = "cuda")]
        if let Some(driver) = err.downcast_ref::<cudarc::driver::DriverError>() {
            return driver.0 == cudarc::driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY;
        }
        if text_is_oom(&err.to_string()) {
            return true;
        }
        next = err.source();
    }
    false
}

#[cfg(feature = "cuda")]
fn cuda_error_is_oom(err: &candle_core::cuda_backend::CudaError) -> bool {
    use candle_core::cuda_backend::CudaError;
    use candle_core::cuda_backend::cudarc::{cublas, driver};

    match err {
        CudaError::Cuda(driver::DriverError(code)) | CudaError::Load { cuda: driver::DriverError(code), .. } => {
            *code == driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
        }
        CudaError::Cublas(cublas::result::CublasError(status)) => {
            *status == cublas::sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED
        }
        CudaError::Curand(candle_core::cuda_backend::cudarc::curand::result::CurandError(status)) => {
            *status == candle_core::cuda_backend::cudarc::curand::sys::curandStatus_t::CURAND_STATUS_ALLOCATION_FAILED
        }
        _ => false,
    }
}

fn text_is_oom(text: &str) -> bool {
    OOM_CODES.iter().any(|code| text.contains(code))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug)]
    struct Text(&'static str);
    impl std::fmt::Display for Text {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str(self.0)
        }
    }
    impl std::error::Error for Text {}

    #[derive(Debug)]
    struct Outer(Text);
    impl std::fmt::Display for Outer {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("kernel launch failed")
        }
    }
    impl std::error::Error for Outer {
        fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
            Some(&self.0)
        }
    }

    const DRIVER_OOM: &str = "DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\")";
    const CUBLAS_OOM: &str = "CublasError(CUBLAS_STATUS_ALLOC_FAILED)";

    fn cuda(text: &'static str) -> CandleError {
        CandleError::Cuda(Box::new(Text(text)))
    }

    fn backtrace(inner: CandleError) -> CandleError {
        CandleError::WithBacktrace {
            inner: Box::new(inner),
            backtrace: Box::new(std::backtrace::Backtrace::disabled()),
        }
    }

    #[test]
    fn table() {
        let cases: Vec<(&str, CandleError, bool)> = vec![
            ("driver oom", cuda(DRIVER_OOM), true),
            ("cublas alloc failed", cuda(CUBLAS_OOM), true),
            ("curand allocation failed", cuda("CurandError(CURAND_STATUS_ALLOCATION_FAILED)"), true),
            (
                "driver oom loading a module",
                cuda("DriverError(CUDA_ERROR_OUT_OF_MEMORY, \"out of memory\") when loading affine"),
                true,
            ),
            ("with backtrace", backtrace(cuda(DRIVER_OOM)), true),
            ("with context", cuda(CUBLAS_OOM).context("in layer 3"), true),
            ("context over backtrace", backtrace(cuda(DRIVER_OOM)).context("step").context("probe"), true),
            ("with path", cuda(DRIVER_OOM).with_path("model.safetensors"), true),
            ("wrapped (synchronize)", CandleError::Wrapped(Box::new(DRIVER_OOM)), true),
            (
                "wrapped with context",
                CandleError::WrappedContext { wrapped: Box::new(Text(CUBLAS_OOM)), context: "gemm".into() },
                true,
            ),
            ("in a source chain", CandleError::Cuda(Box::new(Outer(Text(DRIVER_OOM)))), true),
            ("candle error inside cuda box", CandleError::Cuda(Box::new(backtrace(cuda(DRIVER_OOM)))), true),
            ("stringified", CandleError::Msg(format!("step failed: {DRIVER_OOM}")), true),
            (
                "illegal address",
                cuda("DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"an illegal memory access was encountered\")"),
                false,
            ),
            (
                "launch out of resources",
                cuda("DriverError(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, \"too many resources requested\")"),
                false,
            ),
            ("cublas execution failed", cuda("CublasError(CUBLAS_STATUS_EXECUTION_FAILED)"), false),
            ("the word memory", CandleError::Msg("CUDA out of memory. Tried to allocate 2.00 GiB".into()), false),
            (
                "shape mismatch",
                CandleError::ShapeMismatchBinaryOp { lhs: (2, 3).into(), rhs: (3, 2).into(), op: "add" },
                false,
            ),
            ("context over a shape error", CandleError::UnwrapNone.context("out of memory?"), false),
            ("wrapped other", CandleError::Wrapped(Box::new("device lost")), false),
            ("not compiled with cuda", CandleError::NotCompiledWithCudaSupport, false),
            ("io error", CandleError::Io(std::io::Error::other("no space left")), false),
        ];
        for (name, err, want) in cases {
            assert_eq!(is_oom(&err), want, "{name}: {err}");
        }
    }

    #[test]
    fn a_cublas_execution_failure_may_be_out_of_memory_and_nothing_else_new_is() {
        let failed = || cuda("CublasError(CUBLAS_STATUS_EXECUTION_FAILED)");
        assert!(!is_oom(&failed()) && may_be_oom(&failed()));
        assert!(may_be_oom(&backtrace(failed()).context("gemm")));
        assert!(may_be_oom(&CandleError::Msg("CublasError(CUBLAS_STATUS_EXECUTION_FAILED)".into())));
        assert!(may_be_oom(&cuda(DRIVER_OOM)), "an out-of-memory error is one");
        for other in
            ["DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"illegal\")", "CublasError(CUBLAS_STATUS_NOT_SUPPORTED)"]
        {
            assert!(!may_be_oom(&cuda(other)), "{other}");
        }
    }

    #[test]
    fn an_out_of_memory_error_at_the_meters_synchronize_is_recognized() {
        assert!(meter_error_is_oom(&crate::Error::meter(Text(DRIVER_OOM))));
        assert!(meter_error_is_oom(&crate::Error::Candle(cuda(CUBLAS_OOM))));
        assert!(!meter_error_is_oom(&crate::Error::meter(Text("DriverError(CUDA_ERROR_ILLEGAL_ADDRESS, \"\")"))));
        assert!(!meter_error_is_oom(&crate::Error::zero(crate::Setting::Batch)));
    }

    /// The real error types of candle's CUDA backend (no GPU needed to build them).
    #[cfg(feature = "cuda")]
    mod cuda {
        use super::*;
        use candle_core::cuda_backend::CudaError;
        use candle_core::cuda_backend::cudarc::cublas::{result::CublasError, sys::cublasStatus_t};
        use candle_core::cuda_backend::cudarc::curand::{result::CurandError, sys::curandStatus_t};
        use candle_core::cuda_backend::cudarc::driver::{DriverError, sys::CUresult};

        fn candle(err: CudaError) -> CandleError {
            CandleError::Cuda(Box::new(err))
        }

        #[test]
        fn table() {
            let driver_oom = || CudaError::Cuda(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY));
            let cases: Vec<(&str, CandleError, bool)> = vec![
                ("driver oom", candle(driver_oom()), true),
                (
                    "cublas alloc failed",
                    candle(CudaError::Cublas(CublasError(cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED))),
                    true,
                ),
                (
                    "oom loading a module",
                    candle(CudaError::Load {
                        cuda: DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY),
                        module_name: "affine".into(),
                    }),
                    true,
                ),
                ("with backtrace", backtrace(candle(driver_oom())), true),
                ("with context", candle(driver_oom()).context("matmul"), true),
                ("context over backtrace", backtrace(candle(driver_oom())).context("layer 3").context("step"), true),
                ("candle's own conversion", CandleError::from(driver_oom()), true),
                ("illegal address", candle(CudaError::Cuda(DriverError(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS))), false),
                ("invalid value", candle(CudaError::Cuda(DriverError(CUresult::CUDA_ERROR_INVALID_VALUE))), false),
                (
                    "cublas execution failed",
                    candle(CudaError::Cublas(CublasError(cublasStatus_t::CUBLAS_STATUS_EXECUTION_FAILED))),
                    false,
                ),
                (
                    "load failed otherwise",
                    candle(CudaError::Load {
                        cuda: DriverError(CUresult::CUDA_ERROR_INVALID_PTX),
                        module_name: "affine".into(),
                    }),
                    false,
                ),
                ("missing kernel", candle(CudaError::MissingKernel { module_name: "affine".into() }), false),
                (
                    "curand allocation failed",
                    candle(CudaError::Curand(CurandError(curandStatus_t::CURAND_STATUS_ALLOCATION_FAILED))),
                    true,
                ),
                (
                    "curand other",
                    candle(CudaError::Curand(CurandError(curandStatus_t::CURAND_STATUS_LAUNCH_FAILURE))),
                    false,
                ),
                (
                    "driver oom at the meter's synchronize",
                    CandleError::Cuda(Box::new(DriverError(CUresult::CUDA_ERROR_OUT_OF_MEMORY))),
                    true,
                ),
                ("internal", candle(CudaError::InternalError("out of memory")), false),
            ];
            for (name, err, want) in cases {
                assert_eq!(is_oom(&err), want, "{name}");
            }
        }
    }
}
