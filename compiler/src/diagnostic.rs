//! Diagnostics: what is wrong, where, and how to fix it.
//!
//! Every check has a [`Code`] that never changes meaning once released, so that CI rules,
//! SARIF consumers and people's memories can rely on it.

use std::fmt;

use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Error,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "error",
            Severity::Warning => "warning",
        }
    }
}

/// A position in a source file, 1-based, columns counted in characters.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Location {
    pub file: String,
    pub line: u32,
    pub column: u32,
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}", self.file, self.line, self.column)
    }
}

macro_rules! codes {
    ($($variant:ident = $code:literal, $name:literal, $severity:ident, $summary:literal;)*) => {
        /// Every diagnostic the compiler can emit.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
        pub enum Code { $($variant,)* }

        impl Code {
            pub const ALL: &'static [Code] = &[$(Code::$variant,)*];

            /// The stable identifier (`TSR1xx`), used as the SARIF rule id.
            pub fn as_str(self) -> &'static str {
                match self { $(Code::$variant => $code,)* }
            }
            /// A readable slug, e.g. `unknown-parent`.
            pub fn name(self) -> &'static str {
                match self { $(Code::$variant => $name,)* }
            }
            pub fn severity(self) -> Severity {
                match self { $(Code::$variant => Severity::$severity,)* }
            }
            /// One sentence for rule listings (SARIF `shortDescription`).
            pub fn summary(self) -> &'static str {
                match self { $(Code::$variant => $summary,)* }
            }
        }
    };
}

codes! {
    // Reading the repository.
    YamlSyntax = "TSR002", "yaml-syntax", Error, "The file is not valid YAML.";
    DuplicateKey = "TSR003", "duplicate-key", Error, "A mapping has the same key twice.";
    InputTooLarge = "TSR004", "input-too-large", Error, "A file exceeds a size, depth, alias or node limit, or the whole policy its size, file or document limit.";
    NotADocument = "TSR005", "not-a-document", Error, "A YAML document is not a mapping with apiVersion, kind, metadata and spec.";
    UnknownApiVersion = "TSR006", "unknown-api-version", Error, "The apiVersion is not tessera/v1alpha1.";
    UnknownKind = "TSR007", "unknown-kind", Error, "The kind is not one of the policy language's kinds.";
    // The schema.
    UnknownField = "TSR010", "unknown-field", Error, "A field that the kind does not have.";
    MissingField = "TSR011", "missing-field", Error, "A required field is absent.";
    WrongType = "TSR012", "wrong-type", Error, "A value has the wrong type.";
    InvalidValue = "TSR013", "invalid-value", Error, "A value is outside what the field accepts.";
    // Names and references.
    DuplicateName = "TSR101", "duplicate-name", Error, "Two documents of one kind share a name.";
    UnknownParent = "TSR102", "unknown-parent", Error, "A tenant's parent is not a Tenant.";
    UnknownTier = "TSR103", "unknown-tier", Error, "An SLO class names a tier that PriorityTiers does not define.";
    UnknownSloClass = "TSR104", "unknown-slo-class", Error, "A reference to an SloClass that does not exist.";
    UnknownPool = "TSR105", "unknown-pool", Error, "A reference to a Pool that does not exist.";
    UnknownMigLayout = "TSR106", "unknown-mig-layout", Error, "A pool names a MigLayout that does not exist.";
    UnknownGpuModel = "TSR107", "unknown-gpu-model", Error, "A GPU model that is neither built in nor a GpuModel document.";
    UnknownMigProfile = "TSR108", "unknown-mig-profile", Error, "A MIG profile that the GPU model does not offer.";
    UnknownTenant = "TSR109", "unknown-tenant", Error, "A workload names a Tenant that does not exist.";
    // The tenant tree and quotas.
    NoRootTenant = "TSR110", "no-root-tenant", Error, "No tenant is without a parent.";
    MultipleRootTenants = "TSR111", "multiple-root-tenants", Error, "More than one tenant is without a parent.";
    TenantCycle = "TSR112", "tenant-cycle", Error, "Tenants are their own ancestors.";
    ChildGuaranteesExceedParent = "TSR120", "child-guarantees-exceed-parent", Error, "The children's guarantees add up to more than their parent's.";
    GuaranteeExceedsLimit = "TSR121", "guarantee-exceeds-limit", Error, "A guarantee is above the tenant's limit.";
    LendingLimitExceedsGuarantee = "TSR122", "lending-limit-exceeds-guarantee", Error, "A lending limit is above the guarantee it lends from.";
    GuaranteeExceedsCapacity = "TSR123", "guarantee-exceeds-capacity", Error, "The root's guarantee does not fit the pool's declared capacity.";
    LimitExceedsParent = "TSR124", "limit-exceeds-parent", Error, "A tenant's limit is above its parent's.";
    SloClassNotInherited = "TSR125", "slo-class-not-inherited", Error, "A tenant allows an SLO class its parent does not.";
    InvalidFairShare = "TSR126", "invalid-fair-share", Error, "A tenant's fair-share setting cannot work as written.";
    // Pools, models and MIG.
    MigLayoutNoPlacement = "TSR130", "mig-layout-no-placement", Error, "A MigLayout's instances cannot all be placed on one GPU.";
    MigNotSupported = "TSR131", "mig-not-supported", Error, "MIG is used on a GPU model without MIG.";
    LayoutModelMismatch = "TSR132", "layout-model-mismatch", Error, "A pool uses a MigLayout made for another GPU model.";
    SharingMismatch = "TSR133", "sharing-mismatch", Error, "A pool's sharing mode and its fields disagree.";
    InvalidGpuModel = "TSR134", "invalid-gpu-model", Error, "A GpuModel document is inconsistent.";
    ReservationExceedsCapacity = "TSR135", "reservation-exceeds-capacity", Error, "A pool may hold more GPUs for waiting gangs than it has.";
    IsolationNotOffered = "TSR140", "isolation-not-offered", Error, "No pool that the class's tenants may use offers the class's isolation minimum.";
    DuplicatePriorityValue = "TSR150", "duplicate-priority-value", Error, "Two priority tiers share a value or a name.";
    MissingPriorityTiers = "TSR151", "missing-priority-tiers", Error, "SLO classes exist but no PriorityTiers document, or more than one.";
    // Workloads.
    InvalidGpuRequest = "TSR160", "invalid-gpu-request", Error, "A workload's gpu is not exactly one of count, migProfile, fraction.";
    WorkloadDoesNotFit = "TSR161", "workload-does-not-fit", Error, "No pool the workload may use can ever hold its shape.";
    SloClassNotAllowed = "TSR162", "slo-class-not-allowed", Error, "A workload uses an SLO class its tenant may not use.";
    InvalidMinMember = "TSR163", "invalid-min-member", Error, "minMember is above replicas.";
    // Cluster state.
    InvalidClusterState = "TSR170", "invalid-cluster-state", Error, "The cluster state contradicts itself or the policy.";
    InvalidMigGeometry = "TSR171", "invalid-mig-geometry", Error, "A GPU's current MIG instances break the placement rules.";
    // Warnings: legal, but probably not what was meant.
    UnusableGuarantee = "TSR201", "unusable-guarantee", Warning, "A guarantee no workload of the tenant can ever use.";
    UnusedMigLayout = "TSR202", "unused-mig-layout", Warning, "A MigLayout no pool uses.";
    UnusedSloClass = "TSR203", "unused-slo-class", Warning, "An SloClass no tenant may use.";
    EmptyRepository = "TSR204", "empty-repository", Warning, "No policy document was found.";
    DuplicateUsageResource = "TSR205", "duplicate-usage-resource", Warning, "A fair-share resource is listed more than once.";
    IgnoredClusterState = "TSR206", "ignored-cluster-state", Warning, "Part of a cluster state is stale or names what the policy lacks, and is ignored.";
    // Added after the table was first published: appended, so that the SARIF `ruleIndex` of
    // every earlier code stays what it was.
    NotARegularFile = "TSR008", "not-a-regular-file", Error, "A policy file is a symbolic link, FIFO, socket or device; it is not read.";
    TenantTreeTooDeep = "TSR113", "tenant-tree-too-deep", Error, "The tenant tree is deeper than its limit.";
}

impl fmt::Display for Code {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for Code {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

/// One finding.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Diagnostic {
    pub code: Code,
    pub severity: Severity,
    pub message: String,
    pub location: Option<Location>,
    /// The field in dotted form (`spec.guarantee.h100-train`), when the finding is about one.
    pub field: Option<String>,
    /// How to fix it.
    pub help: Option<String>,
}

impl Diagnostic {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        Diagnostic {
            code,
            severity: code.severity(),
            message: message.into(),
            location: None,
            field: None,
            help: None,
        }
    }
    pub fn at(mut self, location: Option<Location>) -> Self {
        self.location = location;
        self
    }
    pub fn field(mut self, field: impl Into<String>) -> Self {
        self.field = Some(field.into());
        self
    }
    pub fn help(mut self, help: impl Into<String>) -> Self {
        self.help = Some(help.into());
        self
    }
    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }

    /// The order every output uses: by file, line, column, then code and message.
    pub fn sort_key(&self) -> impl Ord + '_ {
        (
            self.location.clone(),
            self.code,
            self.message.as_str(),
            self.field.as_deref(),
        )
    }
}

/// Sorts and removes exact duplicates, so that outputs are stable.
pub fn normalize(diagnostics: &mut Vec<Diagnostic>) {
    diagnostics.sort_by(|a, b| a.sort_key().cmp(&b.sort_key()));
    diagnostics.dedup();
}

/// The closest of `candidates` to `name`, for "did you mean" help.
pub fn did_you_mean<'a>(
    name: &str,
    candidates: impl IntoIterator<Item = &'a str>,
) -> Option<&'a str> {
    candidates
        .into_iter()
        .map(|c| (strsim::jaro_winkler(name, c), c))
        .filter(|(score, _)| *score > 0.8)
        .max_by(|a, b| a.0.total_cmp(&b.0).then_with(|| b.1.cmp(a.1)))
        .map(|(_, c)| c)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn codes_and_names_are_unique() {
        let ids: BTreeSet<_> = Code::ALL.iter().map(|c| c.as_str()).collect();
        let names: BTreeSet<_> = Code::ALL.iter().map(|c| c.name()).collect();
        assert_eq!(ids.len(), Code::ALL.len());
        assert_eq!(names.len(), Code::ALL.len());
    }

    #[test]
    fn suggests_close_names() {
        assert_eq!(
            did_you_mean("reserch", ["research", "platform"]),
            Some("research")
        );
        assert_eq!(did_you_mean("zzz", ["research"]), None);
    }
}
