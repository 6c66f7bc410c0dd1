//! Who holds each GPU of an observation and each of its MIG instances, found once a cycle for
//! both the utilization and the SM activity figures: at 50,000 GPUs some 64,000 bindings are
//! read, and each reading of them is a walk of every record.

use std::collections::HashMap;

use crate::driver::Observation;
use crate::store::WorkloadRecord;

/// One holder of a GPU or of one of its instances.
#[derive(Clone, Copy, Debug, Default)]
pub struct Held {
    /// Its place in the records.
    pub record: u32,
    /// The instance's start; `None`: the whole GPU.
    pub start: Option<u8>,
    /// The share of the unit held; `None`: all of it.
    pub share: Option<f64>,
}

/// The observation's GPUs with their pools and holders.
pub struct Placements<'a> {
    /// The pools of the observation's nodes.
    pub pools: Vec<&'a str>,
    /// Per detail of the observation: its node's pool (in `pools`) and the slot of its GPU's
    /// holders; `None` for a node the observation does not list.
    gpus: Vec<Option<(u32, u32)>>,
    /// Slot `s`'s holders are `held[first[s]..first[s + 1]]`.
    first: Vec<usize>,
    held: Vec<Held>,
}

impl<'a> Placements<'a> {
    /// Every binding of the records that hold a placement, listed under its GPU in the
    /// records' order (a node's pool and a GPU's holders as ordered maps of them found them:
    /// a node listed twice is in its last pool, a GPU listed twice has the same holders).
    pub fn new(observation: &'a Observation, records: &[WorkloadRecord]) -> Placements<'a> {
        let mut pool_ids: HashMap<&str, u32> = HashMap::new();
        let mut pools: Vec<&str> = Vec::new();
        let mut pool_of: HashMap<&str, u32> = HashMap::with_capacity(observation.nodes.len());
        for n in &observation.nodes {
            let id = *pool_ids.entry(n.pool.as_str()).or_insert_with(|| {
                pools.push(&n.pool);
                (pools.len() - 1) as u32
            });
            pool_of.insert(n.name.as_str(), id);
        }
        let mut slot_of: HashMap<(&str, u32), u32> =
            HashMap::with_capacity(observation.details.len());
        let mut gpus = Vec::with_capacity(observation.details.len());
        let mut last: Option<(&str, Option<u32>)> = None;
        for d in &observation.details {
            // Details come node by node: the node's pool looked up once.
            let pool = match last {
                Some((node, pool)) if node == d.gpu.node => pool,
                _ => pool_of.get(d.gpu.node.as_str()).copied(),
            };
            last = Some((d.gpu.node.as_str(), pool));
            gpus.push(pool.map(|pool| {
                let next = slot_of.len() as u32;
                let slot = *slot_of
                    .entry((d.gpu.node.as_str(), d.gpu.index))
                    .or_insert(next);
                (pool, slot)
            }));
        }
        // Counted per slot, then placed: each slot's holders in the records' order.
        let mut placed: Vec<(u32, Held)> = Vec::new();
        for (i, r) in records.iter().enumerate() {
            if !r.phase.holds_placement() {
                continue;
            }
            for b in &r.bindings {
                for &index in &b.gpus {
                    if let Some(&slot) = slot_of.get(&(b.node.as_str(), index)) {
                        let held = Held {
                            record: i as u32,
                            start: b.mig_start,
                            share: b.share.map(|s| s.as_f64()),
                        };
                        placed.push((slot, held));
                    }
                }
            }
        }
        let mut first = vec![0usize; slot_of.len() + 1];
        for &(slot, _) in &placed {
            first[slot as usize + 1] += 1;
        }
        let mut total = 0;
        for f in &mut first {
            total += *f;
            *f = total;
        }
        let mut next = first.clone();
        let mut held = vec![Held::default(); placed.len()];
        for (slot, h) in placed {
            held[next[slot as usize]] = h;
            next[slot as usize] += 1;
        }
        Placements {
            pools,
            gpus,
            first,
            held,
        }
    }

    /// The `detail`-th GPU of the observation: its pool (in `pools`) and its holders, in the
    /// records' order; `None` for a node the observation does not list.
    pub fn gpu(&self, detail: usize) -> Option<(u32, &[Held])> {
        let (pool, slot) = self.gpus[detail]?;
        let slot = slot as usize;
        Some((pool, &self.held[self.first[slot]..self.first[slot + 1]]))
    }
}
