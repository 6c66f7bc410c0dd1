//! Handles are not pointers to memory: they encode (kind, GPU, GPU instance, compute instance)
//! in the pointer's address, so a handle stays meaningful across calls that reload the file.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Handle {
    Device(u32),
    Mig { gpu: u32, gi: u32, ci: u32 },
    GpuInstance { gpu: u32, gi: u32 },
    ComputeInstance { gpu: u32, gi: u32, ci: u32 },
}

const FIELD: u32 = 20;
const MASK: usize = (1 << FIELD) - 1;

impl Handle {
    fn addr(self) -> usize {
        let (tag, gpu, gi, ci) = match self {
            Handle::Device(g) => (1, g, 0, 0),
            Handle::Mig { gpu, gi, ci } => (2, gpu, gi, ci),
            Handle::GpuInstance { gpu, gi } => (3, gpu, gi, 0),
            Handle::ComputeInstance { gpu, gi, ci } => (4, gpu, gi, ci),
        };
        let f = |v: u32| v as usize & MASK;
        (tag << (3 * FIELD)) | (f(gpu) << (2 * FIELD)) | (f(gi) << FIELD) | f(ci)
    }

    fn from_addr(addr: usize) -> Option<Handle> {
        let gpu = ((addr >> (2 * FIELD)) & MASK) as u32;
        let gi = ((addr >> FIELD) & MASK) as u32;
        let ci = (addr & MASK) as u32;
        Some(match addr >> (3 * FIELD) {
            1 => Handle::Device(gpu),
            2 => Handle::Mig { gpu, gi, ci },
            3 => Handle::GpuInstance { gpu, gi },
            4 => Handle::ComputeInstance { gpu, gi, ci },
            _ => return None,
        })
    }

    pub(crate) fn gpu(self) -> u32 {
        match self {
            Handle::Device(gpu)
            | Handle::Mig { gpu, .. }
            | Handle::GpuInstance { gpu, .. }
            | Handle::ComputeInstance { gpu, .. } => gpu,
        }
    }

    pub(crate) fn ptr<T>(self) -> *mut T {
        std::ptr::without_provenance_mut(self.addr())
    }
}

pub(crate) fn handle<T>(p: *mut T) -> Option<Handle> {
    Handle::from_addr(p.addr())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handles_round_trip_and_garbage_is_no_handle() {
        for h in [
            Handle::Device(0),
            Handle::Device(7),
            Handle::Mig {
                gpu: 3,
                gi: 5,
                ci: 0,
            },
            Handle::GpuInstance { gpu: 1, gi: 6 },
            Handle::ComputeInstance {
                gpu: 2,
                gi: 4,
                ci: 1,
            },
        ] {
            assert_eq!(Handle::from_addr(h.addr()), Some(h));
            assert_ne!(h.addr(), 0);
        }
        assert_eq!(Handle::from_addr(0), None);
        assert_eq!(Handle::from_addr(0x1000), None);
    }
}
