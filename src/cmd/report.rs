//! `tessera report usage`: the chargeback report, from the service's metered usage
//! (`GET /v1/usage`), priced and rolled up here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use tessera_compiler::units::parse_rfc3339;
use tessera_reconciler::metering::rates::Rates;
use tessera_reconciler::metering::report::{self, By, UsageReport};

use super::client::{call, percent_encode, refused};
use crate::cli::{ServerArgs, UsageBy, UsageFormat};

pub struct UsageArgs {
    pub server: ServerArgs,
    pub since: String,
    pub until: String,
    pub by: UsageBy,
    pub rates: Option<PathBuf>,
    pub output: UsageFormat,
}

pub fn usage(args: UsageArgs) -> anyhow::Result<ExitCode> {
    // The rates file is checked before the service is asked anything.
    let rates = args
        .rates
        .as_deref()
        .map(Rates::load)
        .transpose()
        .map_err(anyhow::Error::from)?;
    let since = instant("--since", &args.since)?;
    let until = instant("--until", &args.until)?;
    let path = format!(
        "/v1/usage?since={}&until={}",
        percent_encode(&since),
        percent_encode(&until)
    );
    let (status, value) = call(&args.server, "GET", &path, None)?;
    if !(200..300).contains(&status) {
        return refused(status, &value);
    }
    let report: UsageReport =
        serde_json::from_value(value).context("the service answered an unexpected usage report")?;
    let by = match args.by {
        UsageBy::Tenant => By::Tenant,
        UsageBy::Pool => By::Pool,
        UsageBy::Model => By::Model,
    };
    let summary = report::summarize(&report, by, rates.as_ref());
    let text = match args.output {
        UsageFormat::Human => report::human(&summary),
        UsageFormat::Csv => report::csv(&summary),
        UsageFormat::Json => format!("{}\n", serde_json::to_string_pretty(&summary)?),
        UsageFormat::Html => report::html(&summary),
    };
    print!("{text}");
    Ok(ExitCode::SUCCESS)
}

/// A date (midnight UTC) or an RFC 3339 instant, as RFC 3339.
fn instant(flag: &str, value: &str) -> anyhow::Result<String> {
    let text = if value.len() == 10 {
        format!("{value}T00:00:00Z")
    } else {
        value.to_string()
    };
    if parse_rfc3339(&text).is_none() {
        bail!(
            "{flag} {value:?}: give a date (2026-11-01) or an RFC 3339 instant (2026-11-01T08:00:00Z)"
        );
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_date_is_midnight_utc_and_nonsense_is_refused() {
        assert_eq!(
            instant("--since", "2026-11-01").unwrap(),
            "2026-11-01T00:00:00Z"
        );
        assert_eq!(
            instant("--since", "2026-11-01T08:00:00+01:00").unwrap(),
            "2026-11-01T08:00:00+01:00"
        );
        let e = instant("--until", "2026-02-30").unwrap_err().to_string();
        assert!(e.contains("--until"), "{e}");
    }
}
