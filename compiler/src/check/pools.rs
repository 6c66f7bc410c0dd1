//! Pools: model, sharing mode and its fields, layouts for the pool's model.

use std::collections::BTreeMap;

use super::models::{Layout, Models, not_mig_capable, unknown_model};
use super::{Repo, Sink};
use crate::compiled::{Amounts, CompiledNvlinkDomain, CompiledPool, CompiledReconfiguration};
use crate::diagnostic::{Code, Diagnostic, did_you_mean};
use crate::model::{BorrowerPreemption, Document, Kind, NvlinkDomain, Sharing};
use crate::units::{Bytes, Gpus, Millicores};

/// MPS and time-slicing without an explicit client count: four, as NVIDIA's device plugin
/// examples use.
pub const DEFAULT_MAX_CLIENTS_PER_GPU: u32 = 4;

pub(crate) fn resolve(
    repo: &Repo,
    models: &Models,
    layouts: &BTreeMap<String, Layout>,
    sink: &mut Sink,
) -> Vec<CompiledPool> {
    let mut pools = Vec::new();
    for doc in repo.of(Kind::Pool) {
        let Document::Pool(spec) = &doc.document else {
            continue;
        };
        let mut ok = true;
        let model = models.get(&spec.gpu_model);
        if model.is_none() && !repo.defined(Kind::GpuModel, &spec.gpu_model) {
            sink.push(unknown_model(
                models,
                doc,
                "/spec/gpuModel",
                &spec.gpu_model,
            ));
        }
        if model.is_none() {
            ok = false;
        }
        let mut compiled_layouts = Vec::new();
        match spec.sharing {
            Sharing::Mig => {
                if let Some(m) = model
                    && !m.info.is_mig_capable()
                {
                    sink.push(not_mig_capable(doc, "/spec/gpuModel", &spec.gpu_model));
                    ok = false;
                }
                if spec.mig_layouts.is_empty() {
                    sink.push(
                        Diagnostic::new(
                            Code::SharingMismatch,
                            "a pool with `sharing: mig` needs at least one MIG layout",
                        )
                        .at(doc.loc("/spec/sharing"))
                        .field("spec.migLayouts")
                        .help("add `migLayouts: [...]` naming MigLayout documents for this pool's model"),
                    );
                    ok = false;
                }
                for (i, name) in spec.mig_layouts.iter().enumerate() {
                    let ptr = format!("/spec/migLayouts/{i}");
                    match layouts.get(name) {
                        Some(l) if l.gpu_model == spec.gpu_model => {
                            compiled_layouts.push(l.compiled.clone());
                        }
                        Some(l) => {
                            sink.push(
                                Diagnostic::new(
                                    Code::LayoutModelMismatch,
                                    format!(
                                        "MigLayout `{name}` is for {}, but this pool's GPUs are {}",
                                        l.gpu_model, spec.gpu_model
                                    ),
                                )
                                .at(doc.value_loc(&ptr))
                                .field(format!("spec.migLayouts[{i}]"))
                                .help(format!(
                                    "use a layout written for {}, or set the layout's gpuModel",
                                    spec.gpu_model
                                )),
                            );
                            ok = false;
                        }
                        None if repo.defined(Kind::MigLayout, name) => {
                            ok = false; // the layout itself is broken and reported there
                        }
                        None => {
                            let mut help =
                                "define a `MigLayout` with this name, or fix the reference"
                                    .to_owned();
                            if let Some(s) = did_you_mean(name, repo.names(Kind::MigLayout)) {
                                help = format!("did you mean `{s}`?");
                            }
                            sink.push(
                                Diagnostic::new(
                                    Code::UnknownMigLayout,
                                    format!("unknown MigLayout `{name}`"),
                                )
                                .at(doc.value_loc(&ptr))
                                .field(format!("spec.migLayouts[{i}]"))
                                .help(help),
                            );
                            ok = false;
                        }
                    }
                }
            }
            other => {
                if !spec.mig_layouts.is_empty() {
                    sink.push(
                        Diagnostic::new(
                            Code::SharingMismatch,
                            format!(
                                "`migLayouts` is set, but the pool's sharing is `{}`",
                                other.as_str()
                            ),
                        )
                        .at(doc.loc("/spec/migLayouts"))
                        .field("spec.migLayouts")
                        .help("set `sharing: mig`, or remove `migLayouts`"),
                    );
                    ok = false;
                }
            }
        }
        let shares = matches!(spec.sharing, Sharing::Mps | Sharing::Timeslice);
        if spec.max_clients_per_gpu.is_some() && !shares {
            sink.push(
                Diagnostic::new(
                    Code::SharingMismatch,
                    format!(
                        "`maxClientsPerGpu` applies to mps and timeslice pools, not `{}`",
                        spec.sharing.as_str()
                    ),
                )
                .at(doc.loc("/spec/maxClientsPerGpu"))
                .field("spec.maxClientsPerGpu")
                .help("remove it, or set `sharing: mps` or `sharing: timeslice`"),
            );
            ok = false;
        }
        // Not `ok = false`: reservations do not change the pool's shape, so the pool still
        // resolves and nothing that refers to it is reported twice.
        if let Some(r) = &spec.reservations {
            if spec.sharing != Sharing::Exclusive {
                sink.push(
                    Diagnostic::new(
                        Code::SharingMismatch,
                        format!(
                            "`reservations` applies to exclusive pools, not `{}`",
                            spec.sharing.as_str()
                        ),
                    )
                    .at(doc.loc("/spec/reservations"))
                    .field("spec.reservations")
                    .help("reservations hold whole GPUs for gangs: remove `reservations`, or set `sharing: exclusive`"),
                );
            }
            let capacity = u64::from(spec.capacity.nodes) * u64::from(spec.capacity.gpus_per_node);
            if u64::from(r.max_gpus) > capacity {
                sink.push(
                    Diagnostic::new(
                        Code::ReservationExceedsCapacity,
                        format!(
                            "`reservations.maxGpus` is {}, more than the pool's {capacity} GPUs",
                            r.max_gpus
                        ),
                    )
                    .at(doc.value_loc("/spec/reservations/maxGpus"))
                    .field("spec.reservations.maxGpus")
                    .help(format!(
                        "the pool declares {} nodes × {} GPUs; lower maxGpus to at most {capacity}",
                        spec.capacity.nodes, spec.capacity.gpus_per_node
                    )),
                );
            }
        }
        let nodes_per_domain = match (spec.nvlink_domain, spec.capacity.nodes_per_nvlink_domain) {
            (NvlinkDomain::Node, None) => 1,
            (NvlinkDomain::Node, Some(_)) => {
                sink.push(
                    Diagnostic::new(
                        Code::SharingMismatch,
                        "`capacity.nodesPerNvlinkDomain` is set, but `nvlinkDomain` is `node`",
                    )
                    .at(doc.loc("/spec/capacity/nodesPerNvlinkDomain"))
                    .field("spec.capacity.nodesPerNvlinkDomain")
                    .help("set `nvlinkDomain: rack`, or remove `nodesPerNvlinkDomain`"),
                );
                ok = false;
                1
            }
            (NvlinkDomain::Rack, Some(n)) => {
                if n > spec.capacity.nodes {
                    sink.push(
                        Diagnostic::new(
                            Code::SharingMismatch,
                            format!(
                                "an NVLink domain of {n} nodes is larger than the pool's {} nodes",
                                spec.capacity.nodes
                            ),
                        )
                        .at(doc.value_loc("/spec/capacity/nodesPerNvlinkDomain"))
                        .field("spec.capacity.nodesPerNvlinkDomain")
                        .help("make nodesPerNvlinkDomain at most capacity.nodes"),
                    );
                    ok = false;
                }
                n
            }
            (NvlinkDomain::Rack, None) => {
                sink.push(
                    Diagnostic::new(
                        Code::SharingMismatch,
                        "`nvlinkDomain: rack` needs `capacity.nodesPerNvlinkDomain`",
                    )
                    .at(doc.loc("/spec/nvlinkDomain"))
                    .field("spec.capacity.nodesPerNvlinkDomain")
                    .help("add `nodesPerNvlinkDomain` to `capacity` (18 for an NVL72 rack of 4-GPU trays)"),
                );
                ok = false;
                1
            }
        };
        if !ok {
            continue;
        }
        let c = &spec.capacity;
        let nodes = u64::from(c.nodes);
        pools.push(CompiledPool {
            name: doc.name.clone(),
            gpu_model: spec.gpu_model.clone(),
            sharing: spec.sharing,
            node_selector: spec.node_selector.clone(),
            nodes: c.nodes,
            gpus_per_node: c.gpus_per_node,
            cpu_per_node: c.cpu_per_node,
            memory_per_node: c.memory_per_node,
            capacity: Amounts {
                gpus: Gpus::whole(i64::from(c.nodes) * i64::from(c.gpus_per_node)),
                cpu: Some(Millicores(c.cpu_per_node.0.saturating_mul(nodes))),
                memory: Some(Bytes(c.memory_per_node.0.saturating_mul(nodes))),
            },
            nvlink_domain: CompiledNvlinkDomain {
                nodes_per_domain,
                gpus_per_domain: nodes_per_domain * c.gpus_per_node,
            },
            max_clients_per_gpu: shares.then(|| {
                spec.max_clients_per_gpu
                    .unwrap_or(DEFAULT_MAX_CLIENTS_PER_GPU)
            }),
            reconfiguration: CompiledReconfiguration {
                max_per_gpu_per_hour: spec.reconfiguration.max_per_gpu_per_hour,
                drain_timeout_seconds: spec.reconfiguration.drain_timeout.seconds(),
            },
            layouts: compiled_layouts,
            reservation_max_gpus: spec.reservations.as_ref().map(|r| r.max_gpus),
            fair_share_preemption: spec
                .preemption
                .as_ref()
                .is_some_and(|p| p.borrowers == BorrowerPreemption::FairShare),
        });
    }
    pools
}
