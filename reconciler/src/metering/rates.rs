//! Prices for the chargeback report, from a YAML rates file:
//!
//! ```yaml
//! currency: EUR
//! gpuHour:                 # per GPU-hour, by GPU model; a MIG instance costs its slices / 7
//!   NVIDIA H100 80GB HBM3: 2.80
//! migProfileHour:          # optional: per instance-hour, replacing the by-slices price
//!   1g.10gb: 0.35
//! ```
//!
//! Prices are kept in millionths of the currency (exact integers); a price with more than six
//! decimals is refused rather than rounded.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;
use tessera_compiler::mig::{builtin_model, shape::shape};
use tessera_compiler::units::Gpus;

/// Millionths of the currency.
pub type Micros = i64;

const MICROS: f64 = 1_000_000.0;
const SECONDS_PER_HOUR: i128 = 3600;

/// What is wrong with a rates file: where (`file:line:col`) and what to fix.
#[derive(Debug, thiserror::Error)]
pub enum RatesError {
    #[error("{path}: {source}")]
    Read {
        path: String,
        source: std::io::Error,
    },
    #[error("{path}:{line}:{column}: {message}")]
    Invalid {
        path: String,
        line: u64,
        column: u64,
        message: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RatesFile {
    #[serde(default)]
    currency: Option<String>,
    gpu_hour: BTreeMap<String, Spanned<f64>>,
    #[serde(default)]
    mig_profile_hour: BTreeMap<String, Spanned<f64>>,
}

/// Prices per GPU model and MIG profile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rates {
    pub currency: String,
    pub gpu_hour: BTreeMap<String, Micros>,
    pub mig_profile_hour: BTreeMap<String, Micros>,
}

impl Rates {
    pub fn load(path: &Path) -> Result<Rates, RatesError> {
        let shown = path.display().to_string();
        let text = std::fs::read_to_string(path).map_err(|source| RatesError::Read {
            path: shown.clone(),
            source,
        })?;
        Rates::parse(&shown, &text)
    }

    /// Parses the text of a rates file; `path` is what errors name.
    pub fn parse(path: &str, text: &str) -> Result<Rates, RatesError> {
        let file: RatesFile = serde_saphyr::from_str(text).map_err(|e| {
            let (line, column) = e.location().map_or((1, 1), |l| (l.line(), l.column()));
            let full = e.without_snippet().to_string();
            let message = full.lines().next().unwrap_or("invalid YAML").trim();
            RatesError::Invalid {
                path: path.to_owned(),
                line,
                column,
                message: format!(
                    "{message} (a rates file has `currency`, `gpuHour` and `migProfileHour`)"
                ),
            }
        })?;
        let price = |field: &str, key: &str, v: &Spanned<f64>| -> Result<Micros, RatesError> {
            let micros = v.value * MICROS;
            let ok = v.value.is_finite()
                && v.value >= 0.0
                && micros < i64::MAX as f64
                && (micros - micros.round()).abs() < 1e-3;
            if ok {
                Ok(micros.round() as Micros)
            } else {
                Err(RatesError::Invalid {
                    path: path.to_owned(),
                    line: v.referenced.line(),
                    column: v.referenced.column(),
                    message: format!(
                        "{field}.{key}: {} is not a price: give a non-negative amount with at \
                         most six decimals",
                        v.value
                    ),
                })
            }
        };
        let mut rates = Rates {
            currency: file.currency.unwrap_or_default(),
            gpu_hour: BTreeMap::new(),
            mig_profile_hour: BTreeMap::new(),
        };
        for (model, v) in &file.gpu_hour {
            rates
                .gpu_hour
                .insert(model.clone(), price("gpuHour", model, v)?);
        }
        for (profile, v) in &file.mig_profile_hour {
            rates
                .mig_profile_hour
                .insert(profile.clone(), price("migProfileHour", profile, v)?);
        }
        Ok(rates)
    }

    /// The cost of `unit_seconds` of GPU (7000 units per GPU) of `model`, in instances of
    /// `profile` when it is MIG: the profile's own price per instance-hour when the file gives
    /// one, else the model's per GPU-hour. `None` when the file prices neither.
    pub fn cost(&self, model: &str, profile: Option<&str>, unit_seconds: i64) -> Option<Micros> {
        if let Some(p) = profile
            && let Some(&per_instance_hour) = self.mig_profile_hour.get(p)
            && let Some(units) = instance_units(model, p)
        {
            return Some(divide(
                i128::from(unit_seconds) * i128::from(per_instance_hour),
                i128::from(units) * SECONDS_PER_HOUR,
            ));
        }
        let per_gpu_hour = *self.gpu_hour.get(model)?;
        Some(divide(
            i128::from(unit_seconds) * i128::from(per_gpu_hour),
            i128::from(Gpus::UNITS_PER_GPU) * SECONDS_PER_HOUR,
        ))
    }
}

/// The units of one instance of `profile` on `model` (its compute slices in sevenths).
fn instance_units(model: &str, profile: &str) -> Option<i64> {
    let catalog = builtin_model(model)?;
    let id = catalog.resolve_profile(profile)?;
    Some(Gpus::sevenths(i64::from(shape(id)?.compute_slices)).units())
}

/// `n / d` rounded half away from zero (`d > 0`), saturated to `i64`.
fn divide(n: i128, d: i128) -> Micros {
    let q = (n.abs() + d / 2) / d;
    let q = if n < 0 { -q } else { q };
    q.clamp(i128::from(i64::MIN), i128::from(i64::MAX)) as Micros
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prices_parse_to_exact_micros_and_cost_by_model_or_profile() {
        let r = Rates::parse(
            "rates.yaml",
            "currency: EUR\ngpuHour:\n  A100-SXM4-40GB: 2.8\nmigProfileHour:\n  1g.5gb: 0.35\n",
        )
        .unwrap();
        assert_eq!(r.gpu_hour["A100-SXM4-40GB"], 2_800_000);
        // One GPU-hour of whole GPUs.
        let hour = Gpus::UNITS_PER_GPU * 3600;
        assert_eq!(r.cost("A100-SXM4-40GB", None, hour), Some(2_800_000));
        // A 3g instance for an hour, priced by slices: 3/7 of the GPU-hour.
        assert_eq!(
            r.cost("A100-SXM4-40GB", Some("3g.20gb"), 3000 * 3600),
            Some(1_200_000)
        );
        // A 1g instance for an hour, at its own price.
        assert_eq!(
            r.cost("A100-SXM4-40GB", Some("1g.5gb"), 1000 * 3600),
            Some(350_000)
        );
        assert_eq!(r.cost("H100", None, hour), None);
    }

    #[test]
    fn a_bad_price_or_field_is_refused_at_its_line_and_column() {
        let e = Rates::parse("r.yaml", "gpuHour:\n  A100: -1\n").unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("r.yaml:2:"), "{text}");
        assert!(text.contains("gpuHour.A100"), "{text}");
        let e = Rates::parse("r.yaml", "gpuHour:\n  A100: 1.0000001\n").unwrap_err();
        assert!(e.to_string().contains("six decimals"), "{e}");
        let e = Rates::parse("r.yaml", "gpuHour: {}\nprice: 3\n").unwrap_err();
        let text = e.to_string();
        assert!(text.starts_with("r.yaml:2:"), "{text}");
        assert!(text.contains("price"), "{text}");
    }
}
