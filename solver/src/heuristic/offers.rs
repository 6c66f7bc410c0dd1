//! What each GPU, and each node, offers a MIG replica: the profiles of its free instances and
//! the profiles a re-layout around its busy instances would lay out free. The fleet keeps both
//! as GPU states change (`Fleet::occupy`, `Fleet::release`; what-ifs copy them on write with
//! the states), so that placing a replica asks for a place (`Fleet::option`, the costly part:
//! fragmentation measures and re-layouts) only on the nodes that can offer one, instead of on
//! every node of its pool for every replica.

use super::*;
use std::cell::RefCell;

/// Sets of MIG profiles, bit `id` for profile `id`. Profiles from 64 up are not indexed: every
/// node is a candidate for them (see [`Offers::may_offer`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Offers {
    /// A free instance of the profile is laid out on a GPU not held whole.
    pub(super) free: u64,
    /// A re-layout into one of the pool's layouts, around the GPU's busy instances, differs
    /// from its geometry and lays out a free instance of the profile. Within the change budget
    /// or not: a GPU over its budget is where `Fleet::option` records the budget miss.
    pub(super) relayout: u64,
}

/// The bit of `profile_id`, if it is indexed.
pub(super) fn profile_bit(profile_id: u32) -> Option<u64> {
    1u64.checked_shl(profile_id)
}

impl Offers {
    pub(super) fn union(self, other: Offers) -> Offers {
        Offers {
            free: self.free | other.free,
            relayout: self.relayout | other.relayout,
        }
    }

    /// Whether a free instance of `profile_id` is laid out here (`true` for a profile that is
    /// not indexed).
    pub(super) fn has_free(self, profile_id: u32) -> bool {
        profile_bit(profile_id).is_none_or(|b| self.free & b != 0)
    }

    /// Whether `Fleet::option` can find a place for a replica of `demand` here, or record a
    /// budget miss: only for MIG demand does the index know; other demand may always.
    pub(super) fn may_offer(self, demand: Demand) -> bool {
        match demand {
            Demand::Mig { profile_id } => {
                profile_bit(profile_id).is_none_or(|b| (self.free | self.relayout) & b != 0)
            }
            Demand::Whole { .. } | Demand::Share { .. } => true,
        }
    }
}

/// The profiles a re-layout of a GPU offers, by (pool, geometry, held starts): one GPU state's
/// answer asks every layout of its pool, and GPU states repeat across a fleet. Shared by every
/// clone of a fleet (the answers are the same for all).
pub(super) type RelayoutOffers =
    Rc<RefCell<HashMap<(usize, Vec<Placement>, Vec<u8>), u64, foldhash::fast::FixedState>>>;

impl Fleet {
    /// What GPU `g` offers in the state `s`, as `Fleet::option` would find it: healthy GPUs of a
    /// node with a pool only, nothing while it is held whole.
    pub(super) fn offers_of(&self, p: &Problem, g: usize, s: &GpuState) -> Offers {
        if !self.usable(p, g) || s.whole.is_some() {
            return Offers::default();
        }
        let Some(pool) = p.nodes[p.gpus[g].node].pool else {
            return Offers::default();
        };
        let free = s
            .geometry
            .iter()
            .filter(|pl| !s.held.contains_key(&pl.start))
            .filter_map(|pl| profile_bit(pl.profile_id))
            .fold(0, |a, b| a | b);
        let layouts = &p.pools[pool].layouts;
        if layouts.is_empty() {
            return Offers { free, relayout: 0 };
        }
        let key = (pool, s.geometry.clone(), s.held.keys().copied().collect());
        if let Some(&relayout) = self.relayout_offers.borrow().get(&key) {
            return Offers { free, relayout };
        }
        // `Fleet::option`'s re-layout search, for every profile at once.
        let busy = s.busy();
        let mut relayout = 0;
        for layout in layouts {
            let Some(geometry) = self.relayout(layout, &busy) else {
                continue;
            };
            if geometry == s.geometry {
                continue;
            }
            for pl in &geometry {
                if !s.held.contains_key(&pl.start) {
                    relayout |= profile_bit(pl.profile_id).unwrap_or(0);
                }
            }
        }
        self.relayout_offers.borrow_mut().insert(key, relayout);
        Offers { free, relayout }
    }

    /// Stores GPU `g`'s offers after its state changed.
    pub(super) fn reoffer(&mut self, p: &Problem, g: usize) {
        let offers = self.offers_of(p, g, &self.gpu[g]);
        if self.gpu[g].offers != offers {
            self.save_gpu(g);
            Rc::make_mut(&mut self.gpu[g]).offers = offers;
        }
    }
}
