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

/// Writes [`NvmlReturn`] and its conversions from one table: a row per code, with the variant,
/// the bindings' constant, its `nvml.h` name and what `nvmlErrorString` answers for it.
macro_rules! nvml_codes {
    ($($variant:ident = $constant:ident, $name:literal, $message:literal;)*) => {
        /// An NVML return code, named as `nvml.h` names it.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum NvmlReturn {
            $($variant,)*
            /// A code the bindings do not name (a newer driver's); kept as NVML returned it.
            Other(u32),
        }

        /// Every named code, for tables and round-trip tests.
        pub const NAMED: &[NvmlReturn] = &[$(NvmlReturn::$variant,)*];

        /// The bindings' constant of each row, so that a test can check each row's name.
        #[cfg(test)]
        const CONSTANTS: &[&str] = &[$(stringify!($constant),)*];

        impl NvmlReturn {
            /// The code for a raw `nvmlReturn_t`.
            // The bindings' constants keep nvml.h's names.
            #[allow(non_upper_case_globals)]
            pub const fn from_raw(raw: nvmlReturn_t) -> NvmlReturn {
                match raw {
                    $($constant => NvmlReturn::$variant,)*
                    other => NvmlReturn::Other(other),
                }
            }

            /// The raw `nvmlReturn_t`.
            pub const fn raw(self) -> nvmlReturn_t {
                match self {
                    $(NvmlReturn::$variant => $constant,)*
                    NvmlReturn::Other(raw) => raw,
                }
            }

            /// `NVML_SUCCESS` / `NVML_ERROR_*` as `nvml.h` spells it; `None` for
            /// [`NvmlReturn::Other`].
            pub const fn name(self) -> Option<&'static str> {
                match self {
                    $(NvmlReturn::$variant => Some($name),)*
                    NvmlReturn::Other(_) => None,
                }
            }

            /// What `nvmlErrorString` answers, as read from driver 580.159.04 (an unnamed code
            /// reads "Unknown Error" there too).
            pub const fn message(self) -> &'static CStr {
                match self {
                    $(NvmlReturn::$variant => $message,)*
                    NvmlReturn::Other(_) => c"Unknown Error",
                }
            }
        }
    };
}

nvml_codes! {
    Success = nvmlReturn_enum_NVML_SUCCESS, "NVML_SUCCESS", c"Success";
    Uninitialized = nvmlReturn_enum_NVML_ERROR_UNINITIALIZED, "NVML_ERROR_UNINITIALIZED", c"Uninitialized";
    InvalidArgument = nvmlReturn_enum_NVML_ERROR_INVALID_ARGUMENT, "NVML_ERROR_INVALID_ARGUMENT", c"Invalid Argument";
    NotSupported = nvmlReturn_enum_NVML_ERROR_NOT_SUPPORTED, "NVML_ERROR_NOT_SUPPORTED", c"Not Supported";
    NoPermission = nvmlReturn_enum_NVML_ERROR_NO_PERMISSION, "NVML_ERROR_NO_PERMISSION", c"Insufficient Permissions";
    AlreadyInitialized = nvmlReturn_enum_NVML_ERROR_ALREADY_INITIALIZED, "NVML_ERROR_ALREADY_INITIALIZED", c"Already Initialized";
    NotFound = nvmlReturn_enum_NVML_ERROR_NOT_FOUND, "NVML_ERROR_NOT_FOUND", c"Not Found";
    InsufficientSize = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_SIZE, "NVML_ERROR_INSUFFICIENT_SIZE", c"Insufficient Size";
    InsufficientPower = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_POWER, "NVML_ERROR_INSUFFICIENT_POWER", c"Insufficient External Power";
    DriverNotLoaded = nvmlReturn_enum_NVML_ERROR_DRIVER_NOT_LOADED, "NVML_ERROR_DRIVER_NOT_LOADED", c"Driver Not Loaded";
    Timeout = nvmlReturn_enum_NVML_ERROR_TIMEOUT, "NVML_ERROR_TIMEOUT", c"Timeout";
    IrqIssue = nvmlReturn_enum_NVML_ERROR_IRQ_ISSUE, "NVML_ERROR_IRQ_ISSUE", c"Interrupt Request Issue";
    LibraryNotFound = nvmlReturn_enum_NVML_ERROR_LIBRARY_NOT_FOUND, "NVML_ERROR_LIBRARY_NOT_FOUND", c"NVML Shared Library Not Found";
    FunctionNotFound = nvmlReturn_enum_NVML_ERROR_FUNCTION_NOT_FOUND, "NVML_ERROR_FUNCTION_NOT_FOUND", c"Function Not Found";
    CorruptedInforom = nvmlReturn_enum_NVML_ERROR_CORRUPTED_INFOROM, "NVML_ERROR_CORRUPTED_INFOROM", c"Corrupted infoROM";
    GpuIsLost = nvmlReturn_enum_NVML_ERROR_GPU_IS_LOST, "NVML_ERROR_GPU_IS_LOST", c"GPU is lost";
    ResetRequired = nvmlReturn_enum_NVML_ERROR_RESET_REQUIRED, "NVML_ERROR_RESET_REQUIRED", c"GPU requires reset";
    OperatingSystem = nvmlReturn_enum_NVML_ERROR_OPERATING_SYSTEM, "NVML_ERROR_OPERATING_SYSTEM", c"GPU access blocked by the operating system";
    LibRmVersionMismatch = nvmlReturn_enum_NVML_ERROR_LIB_RM_VERSION_MISMATCH, "NVML_ERROR_LIB_RM_VERSION_MISMATCH", c"Driver/library version mismatch";
    InUse = nvmlReturn_enum_NVML_ERROR_IN_USE, "NVML_ERROR_IN_USE", c"In use by another client";
    Memory = nvmlReturn_enum_NVML_ERROR_MEMORY, "NVML_ERROR_MEMORY", c"Insufficient Memory";
    NoData = nvmlReturn_enum_NVML_ERROR_NO_DATA, "NVML_ERROR_NO_DATA", c"No data";
    VgpuEccNotSupported = nvmlReturn_enum_NVML_ERROR_VGPU_ECC_NOT_SUPPORTED, "NVML_ERROR_VGPU_ECC_NOT_SUPPORTED", c"vGPU ECC not supported";
    InsufficientResources = nvmlReturn_enum_NVML_ERROR_INSUFFICIENT_RESOURCES, "NVML_ERROR_INSUFFICIENT_RESOURCES", c"Insufficient Resources";
    FreqNotSupported = nvmlReturn_enum_NVML_ERROR_FREQ_NOT_SUPPORTED, "NVML_ERROR_FREQ_NOT_SUPPORTED", c"Invalid Frequency";
    ArgumentVersionMismatch = nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH, "NVML_ERROR_ARGUMENT_VERSION_MISMATCH", c"Argument version mismatch";
    Deprecated = nvmlReturn_enum_NVML_ERROR_DEPRECATED, "NVML_ERROR_DEPRECATED", c"Requested functionality has been deprecated";
    NotReady = nvmlReturn_enum_NVML_ERROR_NOT_READY, "NVML_ERROR_NOT_READY", c"System is not in ready state";
    GpuNotFound = nvmlReturn_enum_NVML_ERROR_GPU_NOT_FOUND, "NVML_ERROR_GPU_NOT_FOUND", c"No supported GPUs were found";
    InvalidState = nvmlReturn_enum_NVML_ERROR_INVALID_STATE, "NVML_ERROR_INVALID_STATE", c"Resource not in correct state to perform requested operation";
    ResetTypeNotSupported = nvmlReturn_enum_NVML_ERROR_RESET_TYPE_NOT_SUPPORTED, "NVML_ERROR_RESET_TYPE_NOT_SUPPORTED", c"Reset type is not supported for given device";
    Unknown = nvmlReturn_enum_NVML_ERROR_UNKNOWN, "NVML_ERROR_UNKNOWN", c"Unknown Error";
}

impl NvmlReturn {
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
        for &code in NAMED {
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
    fn each_row_names_its_own_constant() {
        for (code, constant) in NAMED.iter().zip(CONSTANTS) {
            assert_eq!(
                Some(constant.trim_start_matches("nvmlReturn_enum_")),
                code.name()
            );
        }
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
