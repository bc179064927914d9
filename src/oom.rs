//! Recognizing out-of-memory errors among everything a candle step can return.

use candle_core::Error as CandleError;

/// The CUDA driver's out-of-memory code and cuBLAS's allocation failure, as
/// they appear in the text of candle's errors (cudarc prints the enum names).
const OOM_CODES: [&str; 2] = ["CUDA_ERROR_OUT_OF_MEMORY", "CUBLAS_STATUS_ALLOC_FAILED"];

/// Whether a workload's error means the device ran out of memory.
///
/// Recognizes the CUDA driver's `CUDA_ERROR_OUT_OF_MEMORY` (also when raised
/// while loading a kernel module) and cuBLAS's `CUBLAS_STATUS_ALLOC_FAILED`,
/// however candle wraps them: `Error::Cuda`, `Context`, `WithBacktrace`,
/// `WithPath`, `Wrapped`, `WrappedContext`, and errors turned into text
/// (`Msg`). The typed value is looked at first (with the `cuda` feature), its
/// text and source chain otherwise: some candle paths (`synchronize`) wrap the
/// driver error in a way that only the text survives. Nothing else counts: a
/// shape error, an illegal address, a cuBLAS execution failure or the word
/// "memory" in a message are not out-of-memory.
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
        if text_is_oom(&err.to_string()) {
            return true;
        }
        next = err.source();
    }
    false
}

#[cfg(feature = "cuda")]
fn cuda_error_is_oom(err: &candle_core::cuda_backend::CudaError) -> bool {
    use candle_core::cuda_backend::cudarc::{cublas, driver};
    use candle_core::cuda_backend::CudaError;

    match err {
        CudaError::Cuda(driver::DriverError(code)) | CudaError::Load { cuda: driver::DriverError(code), .. } => {
            *code == driver::sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY
        }
        CudaError::Cublas(cublas::result::CublasError(status)) => {
            *status == cublas::sys::cublasStatus_t::CUBLAS_STATUS_ALLOC_FAILED
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

    /// The real error types of candle's CUDA backend (no GPU needed to build them).
    #[cfg(feature = "cuda")]
    mod cuda {
        use super::*;
        use candle_core::cuda_backend::cudarc::cublas::{result::CublasError, sys::cublasStatus_t};
        use candle_core::cuda_backend::cudarc::driver::{sys::CUresult, DriverError};
        use candle_core::cuda_backend::CudaError;

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
                ("internal", candle(CudaError::InternalError("out of memory")), false),
            ];
            for (name, err, want) in cases {
                assert_eq!(is_oom(&err), want, "{name}");
            }
        }
    }
}
