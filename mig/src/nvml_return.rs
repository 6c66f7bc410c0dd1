//! NVML return codes (`nvmlReturn_t`): the one place they are written.
//!
//! The node drivers, the fake `libnvidia-ml.so`, [`crate::device`] and the fault plans all speak
//! in these codes. Each value is taken from the `nvml-wrapper-sys` bindings (generated from
//! `nvml.h`), never typed as a number here, so that a code cannot be misremembered in one place
//! and right in another. A code newer than the bindings keeps its number in
//! [`NvmlReturn::Other`]: the journal and the logs say exactly what the library answered.

use std::ffi::CStr;
use std::fmt;

use nvml_wrapper_sys::bindings::*;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An NVML return code, named as `nvml.h` names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum NvmlReturn {
    Success,
    Uninitialized,
    InvalidArgument,
    NotSupported,
    NoPermission,
    AlreadyInitialized,
    NotFound,
    InsufficientSize,
    InsufficientPower,
    DriverNotLoaded,
    Timeout,
    IrqIssue,
    LibraryNotFound,
    FunctionNotFound,
    CorruptedInforom,
    GpuIsLost,
    ResetRequired,
    OperatingSystem,
    LibRmVersionMismatch,
    InUse,
    Memory,
    NoData,
    VgpuEccNotSupported,
    InsufficientResources,
    FreqNotSupported,
    ArgumentVersionMismatch,
    Deprecated,
    NotReady,
    GpuNotFound,
    InvalidState,
    ResetTypeNotSupported,
    Unknown,
    /// A code the bindings do not name (a newer driver's); kept as NVML returned it.
    Other(u32),
}

/// Every named code, for tables and round-trip tests.
pub const NAMED: [NvmlReturn; 32] = {
    use NvmlReturn::*;
    [
        Success,
        Uninitialized,
        InvalidArgument,
        NotSupported,
        NoPermission,
        AlreadyInitialized,
        NotFound,
        InsufficientSize,
        InsufficientPower,
        DriverNotLoaded,
        Timeout,
        IrqIssue,
        LibraryNotFound,
        FunctionNotFound,
        CorruptedInforom,
        GpuIsLost,
        ResetRequired,
        OperatingSystem,
        LibRmVersionMismatch,
        InUse,
        Memory,
        NoData,
        VgpuEccNotSupported,
        InsufficientResources,
        FreqNotSupported,
        ArgumentVersionMismatch,
        Deprecated,
        NotReady,
        GpuNotFound,
        InvalidState,
        ResetTypeNotSupported,
        Unknown,
    ]
};

impl NvmlReturn {
    /// The code for a raw `nvmlReturn_t`.
    // The bindings' constants keep nvml.h's names.
    #[allow(non_upper_case_globals)]
    pub const fn from_raw(raw: nvmlReturn_t) -> NvmlReturn {
        use NvmlReturn::*;
        match raw {
            nvmlReturn_enum_NVML_SUCCESS => Success,
            nvmlReturn_enum_NVML_ERROR_UNINITIALIZED => Uninitialized,
            nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT => InvalidArgument,
            nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED => NotSupported,
            nvmlReturn_enum_NVML_ERROR_NO_PERMISSION => NoPermission,
            nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED => AlreadyInitialized,
            nvmlReturn_enum_NVML_ERROR_NOT_FOUND => NotFound,
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE => InsufficientSize,
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER => InsufficientPower,
            nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED => DriverNotLoaded,
            nvmlReturn_enum_NVML_ERROR_TIMEOUT => Timeout,
            nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE => IrqIssue,
            nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND => LibraryNotFound,
            nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND => FunctionNotFound,
            nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM => CorruptedInforom,
            nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST => GpuIsLost,
            nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED => ResetRequired,
            nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM => OperatingSystem,
            nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH => LibRmVersionMismatch,
            nvmlReturn_enum_NVML_ERROR_IN_USE => InUse,
            nvmlReturn_enum_NVML_ERROR_MEMORY => Memory,
            nvmlReturn_enum_NVML_ERROR_NO_DATA => NoData,
            nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED => VgpuEccNotSupported,
            nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES => InsufficientResources,
            nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED => FreqNotSupported,
            nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH => ArgumentVersionMismatch,
            nvmlReturn_enum_NVML_ERROR_DEPRECATED => Deprecated,
            nvmlReturn_enum_NVML_ERROR_NOT_READY => NotReady,
            nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND => GpuNotFound,
            nvmlReturn_enum_NVML_ERROR_INVALID_STATE => InvalidState,
            nvmlReturn_enum_NVML_ERROR_RESET_TYPE_NOT_SUPPORTED => ResetTypeNotSupported,
            nvmlReturn_enum_NVML_ERROR_UNKNOWN => Unknown,
            other => Other(other),
        }
    }

    /// The raw `nvmlReturn_t`.
    pub const fn raw(self) -> nvmlReturn_t {
        use NvmlReturn::*;
        match self {
            Success => nvmlReturn_enum_NVML_SUCCESS,
            Uninitialized => nvmlReturn_enum_NVML_ERROR_UNINITIALIZED,
            InvalidArgument => nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT,
            NotSupported => nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED,
            NoPermission => nvmlReturn_enum_NVML_ERROR_NO_PERMISSION,
            AlreadyInitialized => nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED,
            NotFound => nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
            InsufficientSize => nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE,
            InsufficientPower => nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER,
            DriverNotLoaded => nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED,
            Timeout => nvmlReturn_enum_NVML_ERROR_TIMEOUT,
            IrqIssue => nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE,
            LibraryNotFound => nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND,
            FunctionNotFound => nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND,
            CorruptedInforom => nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM,
            GpuIsLost => nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST,
            ResetRequired => nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED,
            OperatingSystem => nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM,
            LibRmVersionMismatch => nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH,
            InUse => nvmlReturn_enum_NVML_ERROR_IN_USE,
            Memory => nvmlReturn_enum_NVML_ERROR_MEMORY,
            NoData => nvmlReturn_enum_NVML_ERROR_NO_DATA,
            VgpuEccNotSupported => nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED,
            InsufficientResources => nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES,
            FreqNotSupported => nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED,
            ArgumentVersionMismatch => nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH,
            Deprecated => nvmlReturn_enum_NVML_ERROR_DEPRECATED,
            NotReady => nvmlReturn_enum_NVML_ERROR_NOT_READY,
            GpuNotFound => nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND,
            InvalidState => nvmlReturn_enum_NVML_ERROR_INVALID_STATE,
            ResetTypeNotSupported => nvmlReturn_enum_NVML_ERROR_RESET_TYPE_NOT_SUPPORTED,
            Unknown => nvmlReturn_enum_NVML_ERROR_UNKNOWN,
            Other(raw) => raw,
        }
    }

    /// `NVML_SUCCESS` / `NVML_ERROR_*` as `nvml.h` spells it; `None` for [`NvmlReturn::Other`].
    pub const fn name(self) -> Option<&'static str> {
        use NvmlReturn::*;
        Some(match self {
            Success => "NVML_SUCCESS",
            Uninitialized => "NVML_ERROR_UNINITIALIZED",
            InvalidArgument => "NVML_ERROR_INVALID_ARGUMENT",
            NotSupported => "NVML_ERROR_NOT_SUPPORTED",
            NoPermission => "NVML_ERROR_NO_PERMISSION",
            AlreadyInitialized => "NVML_ERROR_ALREADY_INITIALIZED",
            NotFound => "NVML_ERROR_NOT_FOUND",
            InsufficientSize => "NVML_ERROR_INSUFFICIENT_SIZE",
            InsufficientPower => "NVML_ERROR_INSUFFICIENT_POWER",
            DriverNotLoaded => "NVML_ERROR_DRIVER_NOT_LOADED",
            Timeout => "NVML_ERROR_TIMEOUT",
            IrqIssue => "NVML_ERROR_IRQ_ISSUE",
            LibraryNotFound => "NVML_ERROR_LIBRARY_NOT_FOUND",
            FunctionNotFound => "NVML_ERROR_FUNCTION_NOT_FOUND",
            CorruptedInforom => "NVML_ERROR_CORRUPTED_INFOROM",
            GpuIsLost => "NVML_ERROR_GPU_IS_LOST",
            ResetRequired => "NVML_ERROR_RESET_REQUIRED",
            OperatingSystem => "NVML_ERROR_OPERATING_SYSTEM",
            LibRmVersionMismatch => "NVML_ERROR_LIB_RM_VERSION_MISMATCH",
            InUse => "NVML_ERROR_IN_USE",
            Memory => "NVML_ERROR_MEMORY",
            NoData => "NVML_ERROR_NO_DATA",
            VgpuEccNotSupported => "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED",
            InsufficientResources => "NVML_ERROR_INSUFFICIENT_RESOURCES",
            FreqNotSupported => "NVML_ERROR_FREQ_NOT_SUPPORTED",
            ArgumentVersionMismatch => "NVML_ERROR_ARGUMENT_VERSION_MISMATCH",
            Deprecated => "NVML_ERROR_DEPRECATED",
            NotReady => "NVML_ERROR_NOT_READY",
            GpuNotFound => "NVML_ERROR_GPU_NOT_FOUND",
            InvalidState => "NVML_ERROR_INVALID_STATE",
            ResetTypeNotSupported => "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED",
            Unknown => "NVML_ERROR_UNKNOWN",
            Other(_) => return None,
        })
    }

    /// What `nvmlErrorString` answers, as read from driver 580.159.04 (an unnamed code reads
    /// "Unknown Error" there too).
    pub const fn message(self) -> &'static CStr {
        use NvmlReturn::*;
        match self {
            Success => c"Success",
            Uninitialized => c"Uninitialized",
            InvalidArgument => c"Invalid Argument",
            NotSupported => c"Not Supported",
            NoPermission => c"Insufficient Permissions",
            AlreadyInitialized => c"Already Initialized",
            NotFound => c"Not Found",
            InsufficientSize => c"Insufficient Size",
            InsufficientPower => c"Insufficient External Power",
            DriverNotLoaded => c"Driver Not Loaded",
            Timeout => c"Timeout",
            IrqIssue => c"Interrupt Request Issue",
            LibraryNotFound => c"NVML Shared Library Not Found",
            FunctionNotFound => c"Function Not Found",
            CorruptedInforom => c"Corrupted infoROM",
            GpuIsLost => c"GPU is lost",
            ResetRequired => c"GPU requires reset",
            OperatingSystem => c"GPU access blocked by the operating system",
            LibRmVersionMismatch => c"Driver/library version mismatch",
            InUse => c"In use by another client",
            Memory => c"Insufficient Memory",
            NoData => c"No data",
            VgpuEccNotSupported => c"vGPU ECC not supported",
            InsufficientResources => c"Insufficient Resources",
            FreqNotSupported => c"Invalid Frequency",
            ArgumentVersionMismatch => c"Argument version mismatch",
            Deprecated => c"Requested functionality has been deprecated",
            NotReady => c"System is not in ready state",
            GpuNotFound => c"No supported GPUs were found",
            InvalidState => c"Resource not in correct state to perform requested operation",
            ResetTypeNotSupported => c"Reset type is not supported for given device",
            Unknown | Other(_) => c"Unknown Error",
        }
    }

    /// The spelling fault plans and state files use: the `nvml.h` name without its prefix, in
    /// lower case (`in_use`, `gpu_is_lost`); `None` for [`NvmlReturn::Other`].
    pub fn snake_name(self) -> Option<String> {
        let name = self.name()?;
        let bare = name
            .strip_prefix("NVML_ERROR_")
            .or_else(|| name.strip_prefix("NVML_"))
            .unwrap_or(name);
        Some(bare.to_ascii_lowercase())
    }

    /// Reads a code from its snake name, its `nvml.h` name, or its number.
    pub fn parse(text: &str) -> Option<NvmlReturn> {
        if let Ok(raw) = text.parse::<u32>() {
            return Some(NvmlReturn::from_raw(raw));
        }
        NAMED
            .iter()
            .copied()
            .find(|c| c.name() == Some(text) || c.snake_name().as_deref() == Some(text))
    }
}

impl fmt::Display for NvmlReturn {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => write!(f, "{name} ({})", self.raw()),
            None => write!(f, "NVML return code {} (not in nvml.h's list)", self.raw()),
        }
    }
}

/// As its snake name (`in_use`), or as a number when the bindings do not name it.
impl Serialize for NvmlReturn {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.snake_name() {
            Some(name) => s.serialize_str(&name),
            None => s.serialize_u32(self.raw()),
        }
    }
}

impl<'de> Deserialize<'de> for NvmlReturn {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<NvmlReturn, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = NvmlReturn;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "an NVML return code: a name such as `in_use` or `NVML_ERROR_IN_USE`, or a \
                     number",
                )
            }

            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<NvmlReturn, E> {
                u32::try_from(v)
                    .map(NvmlReturn::from_raw)
                    .map_err(|_| E::custom(format!("{v} is not an NVML return code")))
            }

            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<NvmlReturn, E> {
                u32::try_from(v)
                    .map(NvmlReturn::from_raw)
                    .map_err(|_| E::custom(format!("{v} is not an NVML return code")))
            }

            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<NvmlReturn, E> {
                NvmlReturn::parse(v).ok_or_else(|| {
                    E::custom(format!(
                        "unknown NVML return code `{v}` (expected a name such as `in_use`, \
                         `insufficient_resources`, `gpu_is_lost`, or a number)"
                    ))
                })
            }
        }
        d.deserialize_any(Visitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_named_code_round_trips_through_its_number_and_names() {
        for code in NAMED {
            assert_eq!(NvmlReturn::from_raw(code.raw()), code);
            assert!(!matches!(code, NvmlReturn::Other(_)));
            let snake = code.snake_name().unwrap();
            assert_eq!(NvmlReturn::parse(&snake), Some(code), "{snake}");
            assert_eq!(NvmlReturn::parse(code.name().unwrap()), Some(code));
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(serde_json::from_str::<NvmlReturn>(&json).unwrap(), code);
        }
        // The table holds each code once.
        let mut raws: Vec<u32> = NAMED.iter().map(|c| c.raw()).collect();
        raws.sort_unstable();
        raws.dedup();
        assert_eq!(raws.len(), NAMED.len());
    }

    #[test]
    fn values_are_nvml_hs() {
        let some = [
            (NvmlReturn::Success, 0, "success"),
            (NvmlReturn::InvalidArgument, 2, "invalid_argument"),
            (NvmlReturn::NoPermission, 4, "no_permission"),
            (NvmlReturn::NotFound, 6, "not_found"),
            (NvmlReturn::GpuIsLost, 15, "gpu_is_lost"),
            (NvmlReturn::InUse, 19, "in_use"),
            (
                NvmlReturn::InsufficientResources,
                23,
                "insufficient_resources",
            ),
            (NvmlReturn::Unknown, 999, "unknown"),
        ];
        for (code, raw, snake) in some {
            assert_eq!(
                (code.raw(), code.snake_name().unwrap()),
                (raw, snake.into())
            );
        }
    }

    #[test]
    fn a_code_the_bindings_do_not_name_keeps_its_number() {
        let code = NvmlReturn::from_raw(77);
        assert_eq!(code, NvmlReturn::Other(77));
        assert_eq!(code.raw(), 77);
        assert!(code.to_string().contains("77"), "{code}");
        assert_eq!(serde_json::to_string(&code).unwrap(), "77");
        assert_eq!(serde_json::from_str::<NvmlReturn>("77").unwrap(), code);
        // Codes the old table folded into 999 keep their own names now.
        assert_eq!(
            NvmlReturn::from_raw(18).to_string(),
            "NVML_ERROR_LIB_RM_VERSION_MISMATCH (18)"
        );
    }

    #[test]
    fn a_misspelt_code_is_refused_naming_it() {
        let err = serde_json::from_str::<NvmlReturn>("\"busy\"").unwrap_err();
        assert!(err.to_string().contains("`busy`"), "{err}");
    }
}
