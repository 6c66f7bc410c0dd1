//! Quantities with their units, so that no bare number crosses a module boundary.
//!
//! Every quantity parses from the spelling a platform engineer already knows from Kubernetes
//! (`16`, `500m`, `128Gi`, `90s`) and is stored as an exact integer, so that sums over ten
//! thousand tenants never drift.

use std::borrow::Cow;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// An amount of GPU, exact to one seventh of a milli-GPU.
///
/// A MIG instance counts `compute slices / 7` of a GPU and an MPS or time-slice share counts its
/// fraction in thousandths; 7000 units per GPU represents both without rounding.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Gpus(i64);

impl Gpus {
    pub const UNITS_PER_GPU: i64 = 7000;
    pub const ZERO: Gpus = Gpus(0);

    pub const fn from_units(units: i64) -> Self {
        Gpus(units)
    }
    pub const fn whole(gpus: i64) -> Self {
        Gpus(gpus * Self::UNITS_PER_GPU)
    }
    /// `slices` sevenths of one GPU: a MIG instance with that many compute slices.
    pub const fn sevenths(slices: i64) -> Self {
        Gpus(slices * 1000)
    }
    /// A share in thousandths of a GPU.
    pub const fn milli(milli: i64) -> Self {
        Gpus(milli * 7)
    }
    pub const fn units(self) -> i64 {
        self.0
    }
    pub fn as_f64(self) -> f64 {
        self.0 as f64 / Self::UNITS_PER_GPU as f64
    }
    /// Parses a decimal amount; `None` unless it is a whole number of thousandths or of sevenths.
    pub fn from_f64(value: f64) -> Option<Self> {
        if !value.is_finite() || !(0.0..=1e12).contains(&value) {
            return None;
        }
        let scaled = value * Self::UNITS_PER_GPU as f64;
        let units = scaled.round();
        // 1/7 written as 0.142857 is 999.999 units: accept it, but not 0.0001 GPU.
        if (scaled - units).abs() > 0.01 {
            return None;
        }
        let units = units as i64;
        (units % 7 == 0 || units % 1000 == 0).then_some(Gpus(units))
    }
    pub fn saturating_sub(self, other: Gpus) -> Gpus {
        Gpus((self.0 - other.0).max(0))
    }
}

impl std::ops::Add for Gpus {
    type Output = Gpus;
    fn add(self, rhs: Gpus) -> Gpus {
        Gpus(self.0 + rhs.0)
    }
}
impl std::ops::AddAssign for Gpus {
    fn add_assign(&mut self, rhs: Gpus) {
        self.0 += rhs.0;
    }
}
impl std::ops::Sub for Gpus {
    type Output = Gpus;
    fn sub(self, rhs: Gpus) -> Gpus {
        Gpus(self.0 - rhs.0)
    }
}
impl std::ops::Mul<i64> for Gpus {
    type Output = Gpus;
    fn mul(self, rhs: i64) -> Gpus {
        Gpus(self.0 * rhs)
    }
}
impl std::iter::Sum for Gpus {
    fn sum<I: Iterator<Item = Gpus>>(iter: I) -> Gpus {
        Gpus(iter.map(|g| g.0).sum())
    }
}

impl fmt::Display for Gpus {
    /// Whole GPUs as integers, anything else with up to three decimals (`2.571` for 2 + 4/7).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 % Self::UNITS_PER_GPU == 0 {
            write!(f, "{}", self.0 / Self::UNITS_PER_GPU)
        } else {
            let s = format!("{:.3}", self.as_f64());
            f.write_str(s.trim_end_matches('0'))
        }
    }
}

impl Serialize for Gpus {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        // Rounded to 1e-6 so the JSON spelling is the same on every platform.
        s.serialize_f64((self.as_f64() * 1e6).round() / 1e6)
    }
}

impl<'de> Deserialize<'de> for Gpus {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let v = f64::deserialize(d)?;
        Gpus::from_f64(v).ok_or_else(|| {
            de::Error::custom(format!(
                "{v} is not a GPU amount: use a non-negative decimal with at most three decimals \
                 (0.25) or a whole number of MIG slices in sevenths (0.142857 for 1/7)"
            ))
        })
    }
}

impl JsonSchema for Gpus {
    fn schema_name() -> Cow<'static, str> {
        "Gpus".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "number",
            "minimum": 0,
            "description": "GPUs as a decimal: 1 is a whole GPU, a MIG instance counts its compute slices / 7, an MPS or time-slice share its fraction (0.25)."
        })
    }
}

/// CPU in millicores. Spelled as cores (`16`, `0.5`) or millicores (`500m`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Millicores(pub u64);

impl Millicores {
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        if let Some(m) = s.strip_suffix('m') {
            return m.parse::<u64>().ok().map(Millicores);
        }
        parse_scaled(s, 1000).map(Millicores)
    }
}

impl fmt::Display for Millicores {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0.is_multiple_of(1000) {
            write!(f, "{}", self.0 / 1000)
        } else {
            write!(f, "{}m", self.0)
        }
    }
}

impl Serialize for Millicores {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Millicores {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = NumberOrString::deserialize(d)?;
        let text = raw.to_string();
        Millicores::parse(&text).ok_or_else(|| {
            de::Error::custom(format!(
                "`{text}` is not a CPU amount: write cores (16, 0.5) or millicores (500m)"
            ))
        })
    }
}

impl JsonSchema for Millicores {
    fn schema_name() -> Cow<'static, str> {
        "Cpu".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "CPU: cores as a number (16, 0.5) or millicores as a string (\"500m\").",
            "anyOf": [
                {"type": "number", "minimum": 0},
                {"type": "string", "pattern": "^[0-9]+(\\.[0-9]{1,3})?m?$"}
            ]
        })
    }
}

/// Memory in bytes. Spelled with Kubernetes suffixes: `128Gi`, `512Mi`, `2Ti`, `1G`, or bytes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Bytes(pub u64);

const BINARY_SUFFIXES: [(&str, u64); 6] = [
    ("Ki", 1 << 10),
    ("Mi", 1 << 20),
    ("Gi", 1 << 30),
    ("Ti", 1 << 40),
    ("Pi", 1 << 50),
    ("Ei", 1 << 60),
];
const DECIMAL_SUFFIXES: [(&str, u64); 7] = [
    ("k", 1_000),
    ("K", 1_000),
    ("M", 1_000_000),
    ("G", 1_000_000_000),
    ("T", 1_000_000_000_000),
    ("P", 1_000_000_000_000_000),
    ("E", 1_000_000_000_000_000_000),
];

impl Bytes {
    pub const fn gib(n: u64) -> Self {
        Bytes(n << 30)
    }
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        for (suffix, scale) in BINARY_SUFFIXES.iter().chain(DECIMAL_SUFFIXES.iter()) {
            if let Some(number) = s.strip_suffix(suffix) {
                return parse_scaled(number, *scale).map(Bytes);
            }
        }
        parse_scaled(s, 1).map(Bytes)
    }
}

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (suffix, scale) in BINARY_SUFFIXES.iter().rev() {
            if self.0 >= *scale && self.0.is_multiple_of(*scale) {
                return write!(f, "{}{suffix}", self.0 / scale);
            }
        }
        write!(f, "{}", self.0)
    }
}

impl Serialize for Bytes {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Bytes {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = NumberOrString::deserialize(d)?;
        let text = raw.to_string();
        Bytes::parse(&text).ok_or_else(|| {
            de::Error::custom(format!(
                "`{text}` is not a memory amount: write bytes with a suffix such as 128Gi, 512Mi or 1Ti"
            ))
        })
    }
}

impl JsonSchema for Bytes {
    fn schema_name() -> Cow<'static, str> {
        "Memory".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "description": "Memory: bytes, or a number with a suffix Ki, Mi, Gi, Ti, Pi (powers of 1024) or k, M, G, T, P (powers of 1000), e.g. \"128Gi\".",
            "anyOf": [
                {"type": "integer", "minimum": 0},
                {"type": "string", "pattern": "^[0-9]+(\\.[0-9]+)?(Ki|Mi|Gi|Ti|Pi|Ei|k|K|M|G|T|P|E)?$"}
            ]
        })
    }
}

/// A duration such as `90s`, `10m`, `2h`, `1h30m` or `1d`, kept in whole seconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(pub u64);

impl Duration {
    pub const fn seconds(self) -> u64 {
        self.0
    }
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        let mut total: u64 = 0;
        let mut digits = String::new();
        for c in s.chars() {
            if c.is_ascii_digit() {
                digits.push(c);
                continue;
            }
            let unit = match c {
                's' => 1,
                'm' => 60,
                'h' => 3600,
                'd' => 86_400,
                _ => return None,
            };
            let n: u64 = digits.parse().ok()?;
            total = total.checked_add(n.checked_mul(unit)?)?;
            digits.clear();
        }
        digits.is_empty().then_some(Duration(total))
    }
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut rest = self.0;
        if rest == 0 {
            return f.write_str("0s");
        }
        for (unit, scale) in [("d", 86_400), ("h", 3600), ("m", 60), ("s", 1)] {
            if rest >= scale {
                write!(f, "{}{unit}", rest / scale)?;
                rest %= scale;
            }
        }
        Ok(())
    }
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.to_string())
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        Duration::parse(&text).ok_or_else(|| {
            de::Error::custom(format!(
                "`{text}` is not a duration: write a number with a unit s, m, h or d, e.g. 90s, 10m, 2h, 1h30m"
            ))
        })
    }
}

impl JsonSchema for Duration {
    fn schema_name() -> Cow<'static, str> {
        "Duration".into()
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": "^([0-9]+[smhd])+$",
            "description": "A duration: numbers with units s, m, h, d, e.g. \"90s\", \"10m\", \"2h\", \"1h30m\"."
        })
    }
}

/// `16` and `"16"` read the same for CPU and memory, as in Kubernetes.
#[derive(Deserialize)]
#[serde(untagged)]
enum NumberOrString {
    Int(u64),
    Float(f64),
    Str(String),
}

impl fmt::Display for NumberOrString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            NumberOrString::Int(n) => write!(f, "{n}"),
            NumberOrString::Float(x) => write!(f, "{x}"),
            NumberOrString::Str(s) => f.write_str(s),
        }
    }
}

/// `"1.5"` scaled by 1000 is 1500; `None` when the result is not a whole number.
fn parse_scaled(number: &str, scale: u64) -> Option<u64> {
    let (int, frac) = number.split_once('.').unwrap_or((number, ""));
    if int.is_empty() || !int.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if !frac.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let mut value = int.parse::<u64>().ok()?.checked_mul(scale)?;
    let mut divisor = 1u64;
    let mut frac_value = 0u64;
    for b in frac.bytes() {
        divisor = divisor.checked_mul(10)?;
        frac_value = frac_value * 10 + u64::from(b - b'0');
    }
    let scaled_frac = frac_value.checked_mul(scale)?;
    if scaled_frac % divisor != 0 {
        return None;
    }
    value = value.checked_add(scaled_frac / divisor)?;
    Some(value)
}

/// Parses an RFC 3339 instant, `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`, to the second
/// (fractions dropped: every instant tessera keeps is whole seconds, so that what it writes
/// reads back equal). jiff knows the calendar: `2026-02-30` and `24:00:00` are refused, so
/// that a snapshot's instants can be compared; a leap second (`:60`) reads as `:59`. The form
/// is checked first, because jiff also reads ISO 8601 forms RFC 3339 lacks (a space for `T`,
/// no seconds, no offset).
pub fn parse_rfc3339(s: &str) -> Option<jiff::Timestamp> {
    if !rfc3339_form(s) {
        return None;
    }
    let t = s.parse::<jiff::Timestamp>().ok()?;
    jiff::Timestamp::from_second(t.as_second()).ok()
}

/// An instant as RFC 3339 in UTC to the second, `YYYY-MM-DDTHH:MM:SSZ`: how every instant is
/// written (the API, the store, snapshots, decisions).
pub fn format_rfc3339(t: jiff::Timestamp) -> String {
    unix(t.as_second()).to_string()
}

/// Unix seconds as an instant, clamped to jiff's range (years -9999 to 9999): where instants
/// come from integer columns and arithmetic on seconds.
pub fn unix(seconds: i64) -> jiff::Timestamp {
    let (min, max) = (
        jiff::Timestamp::MIN.as_second(),
        jiff::Timestamp::MAX.as_second(),
    );
    jiff::Timestamp::from_second(seconds.clamp(min, max)).unwrap_or(jiff::Timestamp::UNIX_EPOCH)
}

/// Now, to the second: the one way tessera reads the clock, so that every instant it keeps
/// and writes is whole seconds.
pub fn now() -> jiff::Timestamp {
    unix(jiff::Timestamp::now().as_second())
}

/// Serde for an instant in a document: RFC 3339 as [`parse_rfc3339`] reads it (an error that
/// says what to write otherwise, at the value's place) and as [`format_rfc3339`] writes it.
/// `#[serde(with = "crate::units::rfc3339")]`, with `#[schemars(with = "Rfc3339")]`.
pub mod rfc3339 {
    use serde::{Deserialize, Deserializer, Serializer, de};

    const HELP: &str = "write a date and time with its offset, e.g. 2026-11-20T08:00:00Z";

    pub fn serialize<S: Serializer>(t: &jiff::Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&super::format_rfc3339(*t))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<jiff::Timestamp, D::Error> {
        let text = String::deserialize(d)?;
        super::parse_rfc3339(&text).ok_or_else(|| {
            de::Error::custom(format!(
                "`{text}` is not an RFC 3339 instant (no such date or time): {HELP}"
            ))
        })
    }

    /// The same for an optional instant (`null` or absent is `None`).
    pub mod option {
        use serde::{Deserialize, Deserializer, Serializer};

        pub fn serialize<S: Serializer>(
            t: &Option<jiff::Timestamp>,
            s: S,
        ) -> Result<S::Ok, S::Error> {
            match t {
                Some(t) => super::serialize(t, s),
                None => s.serialize_none(),
            }
        }

        pub fn deserialize<'de, D: Deserializer<'de>>(
            d: D,
        ) -> Result<Option<jiff::Timestamp>, D::Error> {
            #[derive(Deserialize)]
            struct Instant(#[serde(with = "super")] jiff::Timestamp);
            Ok(Option::<Instant>::deserialize(d)?.map(|Instant(t)| t))
        }
    }
}

/// The JSON Schema of an instant: a `date-time` string in RFC 3339's form (the calendar is
/// checked when the document is read).
pub struct Rfc3339;

impl JsonSchema for Rfc3339 {
    fn schema_name() -> Cow<'static, str> {
        "Rfc3339".into()
    }
    fn inline_schema() -> bool {
        true
    }
    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "format": "date-time",
            "pattern": r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]+)?(Z|[+-][0-9]{2}:[0-9]{2})$"
        })
    }
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)` by shape alone (digits where digits go).
fn rfc3339_form(s: &str) -> bool {
    let b = s.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    if b.len() < 20
        || !(digits(0..4) && digits(5..7) && digits(8..10))
        || !(digits(11..13) && digits(14..16) && digits(17..19))
        || b[4] != b'-'
        || b[7] != b'-'
        || !matches!(b[10], b'T' | b't')
        || b[13] != b':'
        || b[16] != b':'
    {
        return false;
    }
    let mut rest = &b[19..];
    if let Some(frac) = rest.strip_prefix(b".") {
        let n = frac.iter().take_while(|c| c.is_ascii_digit()).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    match rest {
        [b'Z' | b'z'] => true,
        [b'+' | b'-', h1, h2, b':', m1, m2] => [h1, h2, m1, m2].iter().all(|c| c.is_ascii_digit()),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpus_are_exact_in_sevenths_and_thousandths() {
        assert_eq!(Gpus::from_f64(3.5), Some(Gpus::milli(3500)));
        assert_eq!(Gpus::from_f64(0.142857), Some(Gpus::sevenths(1)));
        assert_eq!(Gpus::from_f64(0.25), Some(Gpus::milli(250)));
        assert_eq!(Gpus::from_f64(0.0001), None);
        assert_eq!(Gpus::from_f64(-1.0), None);
        assert_eq!(Gpus::sevenths(3).to_string(), "0.429");
        assert_eq!(Gpus::sevenths(18).to_string(), "2.571");
        assert_eq!(Gpus::whole(64).to_string(), "64");
        assert_eq!(Gpus::milli(250).to_string(), "0.25");
    }

    #[test]
    fn cpu_spellings() {
        assert_eq!(Millicores::parse("16"), Some(Millicores(16_000)));
        assert_eq!(Millicores::parse("0.5"), Some(Millicores(500)));
        assert_eq!(Millicores::parse("500m"), Some(Millicores(500)));
        assert_eq!(Millicores::parse("0.0001"), None);
        assert_eq!(Millicores::parse("lots"), None);
    }

    #[test]
    fn memory_spellings() {
        assert_eq!(Bytes::parse("128Gi"), Some(Bytes(128 << 30)));
        assert_eq!(Bytes::parse("1.5Gi"), Some(Bytes(3 << 29)));
        assert_eq!(Bytes::parse("1G"), Some(Bytes(1_000_000_000)));
        assert_eq!(Bytes::parse("4096"), Some(Bytes(4096)));
        assert_eq!(Bytes::parse("12GB"), None);
        assert_eq!(Bytes(2 << 40).to_string(), "2Ti");
    }

    #[test]
    fn durations() {
        assert_eq!(Duration::parse("90s"), Some(Duration(90)));
        assert_eq!(Duration::parse("1h30m"), Some(Duration(5400)));
        assert_eq!(Duration::parse("2h"), Some(Duration(7200)));
        assert_eq!(Duration::parse("10"), None);
        assert_eq!(Duration::parse("5x"), None);
        assert_eq!(Duration(5400).to_string(), "1h30m");
    }

    #[test]
    fn rfc3339_instants() {
        let secs = |s: &str| parse_rfc3339(s).map(|t| t.as_second());
        assert_eq!(secs("1970-01-01T00:00:00Z"), Some(0));
        assert_eq!(secs("1970-01-01T01:00:00+01:00"), Some(0));
        assert_eq!(secs("2000-03-01T00:00:00.5Z"), Some(951_868_800));
        assert_eq!(secs("2024-02-29T00:00:00Z"), Some(1_709_164_800));
        assert_eq!(secs("2026-11-20T08:00:00Z"), Some(1_795_161_600));
        assert_eq!(format_rfc3339(unix(1_795_161_600)), "2026-11-20T08:00:00Z");
        assert_eq!(format_rfc3339(unix(-1)), "1969-12-31T23:59:59Z");
        assert!(format_rfc3339(unix(i64::MAX)).starts_with("9999-12-"));
        // Fractions are dropped, so that what is written reads back equal.
        let fraction = "2000-03-01T00:00:00.5Z".parse::<jiff::Timestamp>().unwrap();
        assert_eq!(format_rfc3339(fraction), "2000-03-01T00:00:00Z");
        assert_eq!(now().subsec_nanosecond(), 0);
        for bad in [
            "2026-11-20 08:00:00Z",
            "2026-13-20T08:00:00Z",
            "2026-02-29T08:00:00Z",
            "2026-04-31T08:00:00Z",
            "2026-11-20T24:00:00Z",
            "2026-11-20T08:00:00",
            "2026-11-20T08:00:00.Z",
            "2026-11-20T08:00:00+1:00",
            "2026-11-20T08:00:00+01:60",
            "2026-11-20T08:00Z",
            "20261120T080000Z",
            "yesterday",
        ] {
            assert_eq!(parse_rfc3339(bad), None, "{bad}");
        }
    }

    proptest::proptest! {
        /// What is written reads back as the same instant, in any offset; years 0 to 9999.
        #[test]
        fn instants_round_trip(t in -62_167_219_200i64..253_402_300_800, offset in -1439i32..1440) {
            let text = format_rfc3339(unix(t));
            proptest::prop_assert_eq!(parse_rfc3339(&text), Some(unix(t)));
            // The same instant written at another offset.
            let zone = jiff::tz::TimeZone::fixed(jiff::tz::Offset::from_seconds(offset * 60).unwrap());
            let local = jiff::Timestamp::from_second(t).unwrap().to_zoned(zone).datetime();
            let sign = if offset < 0 { '-' } else { '+' };
            let shifted = format!(
                "{}{sign}{:02}:{:02}",
                local.strftime("%Y-%m-%dT%H:%M:%S"),
                offset.abs() / 60,
                offset.abs() % 60
            );
            if local.year() >= 0 {
                proptest::prop_assert_eq!(parse_rfc3339(&shifted), Some(unix(t)), "{}", shifted);
            }
        }
    }
}
