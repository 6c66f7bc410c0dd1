//! `tessera report usage`: the chargeback report, from the service's metered usage
//! (`GET /v1/usage`), priced and rolled up here.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, bail};
use tessera_reconciler::metering::rates::Rates;
use tessera_reconciler::metering::report::{self, By, UsageReport};

use super::client::{call, percent_encode, refused};
use crate::cli::{ServerArgs, UsageBy, UsageFormat};

pub struct UsageArgs {
    pub server: ServerArgs,
    pub since: jiff::Timestamp,
    pub until: jiff::Timestamp,
    pub by: UsageBy,
    pub team_depth: usize,
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
    if args.since >= args.until {
        bail!(
            "--since {} is not before --until {}: the report counts [SINCE, UNTIL)",
            args.since,
            args.until
        );
    }
    let path = format!(
        "/v1/usage?since={}&until={}",
        percent_encode(&args.since.to_string()),
        percent_encode(&args.until.to_string())
    );
    let (status, value) = call(&args.server, "GET", &path, None)?;
    if !(200..300).contains(&status) {
        return refused(status, &value);
    }
    let report: UsageReport =
        serde_json::from_value(value).context("the service answered an unexpected usage report")?;
    let by = match args.by {
        UsageBy::Tenant => By::Tenant,
        UsageBy::Team => By::Team {
            depth: args.team_depth,
        },
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

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_reconciler::metering::report::TenantPath;
    use tessera_reconciler::store::usage::UsageRow;

    const HOUR: i64 = 7000 * 3600;

    /// acme's shape: root, organisations, teams, projects; usage on projects, on a team, on an
    /// organisation itself, and on a tenant the policy no longer has.
    fn fixture() -> UsageReport {
        let tree: [&[&str]; 9] = [
            &["acme"],
            &["acme", "platform"],
            &["acme", "platform", "infra"],
            &["acme", "research"],
            &["acme", "research", "nlp"],
            &["acme", "research", "nlp", "nlp-finetune"],
            &["acme", "research", "nlp", "nlp-pretrain"],
            &["acme", "research", "vision"],
            &["acme", "research", "vision", "vision-detect"],
        ];
        let row =
            |tenant: &str, pool: &str, model: &str, profile: Option<&str>, hours: i64| UsageRow {
                tenant: tenant.into(),
                pool: pool.into(),
                model: Some(model.into()),
                profile: profile.map(str::to_owned),
                gpu_unit_seconds: hours,
                guaranteed_unit_seconds: hours * 3 / 4,
                borrowed_unit_seconds: hours - hours * 3 / 4,
                cpu_millicore_seconds: hours / 7,
                memory_mib_seconds: hours * 2,
                ..UsageRow::default()
            };
        UsageReport {
            since: 1_793_491_200,
            until: 1_796_083_200,
            tenants: tree
                .iter()
                .map(|path| TenantPath {
                    name: path.last().unwrap().to_string(),
                    path: path.iter().map(|s| s.to_string()).collect(),
                })
                .collect(),
            rows: vec![
                row(
                    "nlp-pretrain",
                    "h100-train",
                    "H100-SXM5-80GB",
                    None,
                    640 * HOUR,
                ),
                row(
                    "nlp-finetune",
                    "h100-train",
                    "H100-SXM5-80GB",
                    None,
                    96 * HOUR + 7,
                ),
                row("nlp", "l40s-dev", "L40S-48GB", None, 12 * HOUR),
                row(
                    "vision-detect",
                    "h100-infer",
                    "H100-SXM5-80GB",
                    Some("1g.10gb"),
                    HOUR * 5 / 7,
                ),
                row("research", "h100-train", "H100-SXM5-80GB", None, 3 * HOUR),
                row(
                    "infra",
                    "h100-infer",
                    "H100-SXM5-80GB",
                    Some("3g.40gb"),
                    30 * HOUR,
                ),
                row("retired-team", "h100-train", "H100-SXM5-80GB", None, HOUR),
                UsageRow {
                    tenant: "nlp-pretrain".into(),
                    pool: "h100-train".into(),
                    reserved_idle_unit_seconds: 16 * HOUR,
                    preemption_lost_unit_seconds: 2 * HOUR,
                    ..UsageRow::default()
                },
            ],
        }
    }

    fn rates() -> Rates {
        Rates::parse(
            "rates.yaml",
            "currency: EUR\ngpuHour:\n  H100-SXM5-80GB: 2.80\n  L40S-48GB: 0.90\n\
             migProfileHour:\n  1g.10gb: 0.35\n",
        )
        .unwrap()
    }

    #[test]
    fn usage_by_team_rolls_projects_up_to_their_team() {
        let summary = report::summarize(&fixture(), By::Team { depth: 2 }, Some(&rates()));
        insta::assert_snapshot!("usage_by_team_human", report::human(&summary));
        insta::assert_snapshot!("usage_by_team_csv", report::csv(&summary));
    }

    #[test]
    fn usage_by_tenant_and_by_team_at_depth_one() {
        let summary = report::summarize(&fixture(), By::Tenant, Some(&rates()));
        insta::assert_snapshot!("usage_by_tenant_human", report::human(&summary));
        insta::assert_snapshot!("usage_by_tenant_csv", report::csv(&summary));
        let orgs = report::summarize(&fixture(), By::Team { depth: 1 }, None);
        insta::assert_snapshot!("usage_by_organisation_human", report::human(&orgs));
    }

    /// Whatever the depth, every row counts in exactly one line: the lines add up to the
    /// total, figure by figure and in cost.
    #[test]
    fn team_lines_add_up_to_the_total_at_every_depth() {
        let r = fixture();
        for depth in 0..6 {
            let s = report::summarize(&r, By::Team { depth }, Some(&rates()));
            let sum = |f: fn(&report::Line) -> i64| s.lines.iter().map(f).sum::<i64>();
            assert_eq!(sum(|l| l.gpu_unit_seconds), s.total.gpu_unit_seconds);
            assert_eq!(
                sum(|l| l.borrowed_unit_seconds),
                s.total.borrowed_unit_seconds
            );
            assert_eq!(
                sum(|l| l.reserved_idle_unit_seconds),
                s.total.reserved_idle_unit_seconds
            );
            assert_eq!(
                sum(|l| l.cost_micros.unwrap_or(0)),
                s.total.cost_micros.unwrap()
            );
        }
    }
}
