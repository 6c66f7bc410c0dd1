//! Kubernetes quantities for the amounts Kueue holds: GPUs (exact to a thousandth), weights.

use tessera_compiler::units::Gpus;

/// Units of [`Gpus`] in one thousandth of a GPU.
const UNITS_PER_MILLI: i64 = Gpus::UNITS_PER_GPU / 1000;

/// `Gpus` as a quantity: `8`, `1500m`. `None` when the amount is not a whole number of
/// thousandths (a MIG seventh, say); the caller rounds with [`gpus_rounded_down`] and warns.
pub fn gpus(g: Gpus) -> Option<String> {
    let units = g.units();
    if units % Gpus::UNITS_PER_GPU == 0 {
        Some((units / Gpus::UNITS_PER_GPU).to_string())
    } else if units % UNITS_PER_MILLI == 0 {
        Some(format!("{}m", units / UNITS_PER_MILLI))
    } else {
        None
    }
}

/// The largest quantity not above `g`.
pub fn gpus_rounded_down(g: Gpus) -> String {
    let milli = g.units().div_euclid(UNITS_PER_MILLI);
    gpus(Gpus::milli(milli)).expect("a whole number of thousandths")
}

/// A quantity of GPUs: an integer, a decimal (`1.5`) or thousandths (`1500m`).
pub fn parse_gpus(text: &str) -> Result<Gpus, String> {
    let milli = parse_milli(text).ok_or_else(|| {
        format!("{text:?} is not a GPU quantity: write an integer, a decimal (1.5) or thousandths (1500m)")
    })?;
    if milli < 0 {
        return Err(format!("{text:?}: a quota cannot be negative"));
    }
    Ok(Gpus::milli(milli))
}

/// `2`, `1.5`, `1500m` → thousandths; anything finer or any other suffix is `None`.
fn parse_milli(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Some(m) = text.strip_suffix('m') {
        return m.parse::<i64>().ok();
    }
    let (whole, frac) = match text.split_once('.') {
        Some((w, f)) => (w, f),
        None => (text, ""),
    };
    if frac.len() > 3 || !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let whole: i64 = if whole.is_empty() {
        0
    } else {
        whole.parse().ok()?
    };
    let frac_milli: i64 = if frac.is_empty() {
        0
    } else {
        format!("{frac:0<3}").parse().ok()?
    };
    whole.checked_mul(1000)?.checked_add(frac_milli)
}

/// A fair-sharing weight: the shortest decimal that reads back as the same `f64`.
pub fn weight(w: f64) -> String {
    if w.fract() == 0.0 && w.abs() < 1e15 {
        format!("{}", w as i64)
    } else {
        format!("{w}")
    }
}

pub fn parse_weight(text: &str) -> Result<f64, String> {
    let bad = || format!("{text:?} is not a weight: write a decimal such as 1, 2 or 0.5");
    let text = text.trim();
    let value = match text.strip_suffix('m') {
        Some(m) => m.parse::<f64>().map_err(|_| bad())? / 1000.0,
        None => text.parse::<f64>().map_err(|_| bad())?,
    };
    if !value.is_finite() || value < 0.0 {
        return Err(bad());
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_quantities_read_back_exactly() {
        for (g, text) in [
            (Gpus::whole(8), "8"),
            (Gpus::milli(1500), "1500m"),
            (Gpus::ZERO, "0"),
        ] {
            assert_eq!(gpus(g).as_deref(), Some(text));
            assert_eq!(parse_gpus(text).unwrap(), g);
        }
        assert_eq!(parse_gpus("1.5").unwrap(), Gpus::milli(1500));
        assert_eq!(parse_gpus("0.25").unwrap(), Gpus::milli(250));
        assert!(gpus(Gpus::sevenths(3)).is_none());
        assert_eq!(gpus_rounded_down(Gpus::sevenths(3)), "428m");
        assert!(parse_gpus("1Ki").is_err());
        assert!(parse_gpus("-1").is_err());
        assert!(parse_gpus("0.0001").is_err());
    }

    #[test]
    fn weights_read_back_exactly() {
        for w in [1.0, 2.0, 0.5, 3.25, 0.01, 1000.0] {
            assert_eq!(parse_weight(&weight(w)).unwrap(), w);
        }
        assert_eq!(parse_weight("500m").unwrap(), 0.5);
        assert!(parse_weight("heavy").is_err());
    }
}
