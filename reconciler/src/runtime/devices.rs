//! Which device nodes a replica's sandbox shows: the GPUs it was given and nothing else, so that
//! another tenant's GPU cannot be opened even by path (`CUDA_VISIBLE_DEVICES` only asks CUDA
//! to hide devices the process could still open).
//!
//! NVIDIA's nodes: `/dev/nvidiaN` per GPU (N its minor number, which tessera takes to be its
//! NVML index), the shared control nodes every CUDA process opens, and for a MIG instance the
//! capability nodes `/dev/nvidia-caps/nvidia-capM` granting access to its GPU instance and
//! compute instance, M read from `/proc/driver/nvidia-caps/mig-minors`.

use std::path::Path;

/// One GPU of a replica: a whole GPU, or one MIG compute instance on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct GpuDevice {
    /// The GPU's index (and minor number).
    pub index: u32,
    /// `(GPU instance id, compute instance id)` for a MIG device.
    pub mig: Option<(u32, u32)>,
}

/// Opened by every CUDA process whatever its GPUs; shown when the host has them.
const SHARED: [&str; 4] = [
    "nvidiactl",
    "nvidia-uvm",
    "nvidia-uvm-tools",
    "nvidia-modeset",
];

/// The node names under `/dev` the replica may open, those present under `device_root`.
/// A GPU's node missing from the host is left out (a simulated fleet has none); a MIG
/// instance the driver's minor table does not list is an error, since the workload could not
/// use it.
pub fn nodes(
    gpus: &[GpuDevice],
    device_root: &Path,
    mig_minors: &Path,
) -> Result<Vec<String>, String> {
    let mut names: Vec<String> = SHARED.iter().map(|s| s.to_string()).collect();
    let mut table = None;
    for gpu in gpus {
        names.push(format!("nvidia{}", gpu.index));
        if let Some((gi, ci)) = gpu.mig {
            let text = match &table {
                Some(text) => text,
                None => table.insert(match std::fs::read_to_string(mig_minors) {
                    Ok(text) => text,
                    // No NVIDIA driver: no capability nodes to show either.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => String::new(),
                    Err(e) => return Err(format!("{}: {e}", mig_minors.display())),
                }),
            };
            if text.is_empty() {
                continue;
            }
            for key in [
                format!("gpu{}/gi{gi}/access", gpu.index),
                format!("gpu{}/gi{gi}/ci{ci}/access", gpu.index),
            ] {
                let minor = minor_of(text, &key).ok_or_else(|| {
                    format!(
                        "{} has no {key}: the MIG instance's capability cannot be granted",
                        mig_minors.display()
                    )
                })?;
                names.push(format!("nvidia-caps/nvidia-cap{minor}"));
            }
        }
    }
    names.sort();
    names.dedup();
    names.retain(|n| device_root.join(n).exists());
    Ok(names)
}

/// The minor for `key` in `mig-minors` (lines `gpu0/gi1/access 12`).
fn minor_of(table: &str, key: &str) -> Option<u32> {
    table.lines().find_map(|line| {
        let (name, minor) = line.trim().split_once(char::is_whitespace)?;
        (name == key).then(|| minor.trim().parse().ok()).flatten()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replica_sees_its_gpus_and_its_mig_capabilities_only() {
        let dev = tempfile::tempdir().unwrap();
        std::fs::create_dir(dev.path().join("nvidia-caps")).unwrap();
        for n in [
            "nvidiactl",
            "nvidia0",
            "nvidia1",
            "nvidia-caps/nvidia-cap21",
            "nvidia-caps/nvidia-cap22",
            "nvidia-caps/nvidia-cap30",
        ] {
            std::fs::write(dev.path().join(n), "").unwrap();
        }
        let minors = dev.path().join("mig-minors");
        std::fs::write(
            &minors,
            "config 1\nmonitor 2\ngpu1/gi2/access 21\ngpu1/gi2/ci0/access 22\n\
             gpu1/gi3/access 30\ngpu1/gi3/ci0/access 31\n",
        )
        .unwrap();
        let whole = [GpuDevice {
            index: 0,
            mig: None,
        }];
        assert_eq!(
            nodes(&whole, dev.path(), &minors).unwrap(),
            ["nvidia0", "nvidiactl"]
        );
        let mig = [GpuDevice {
            index: 1,
            mig: Some((2, 0)),
        }];
        assert_eq!(
            nodes(&mig, dev.path(), &minors).unwrap(),
            [
                "nvidia-caps/nvidia-cap21",
                "nvidia-caps/nvidia-cap22",
                "nvidia1",
                "nvidiactl"
            ]
        );
        let unknown = [GpuDevice {
            index: 1,
            mig: Some((9, 0)),
        }];
        let err = nodes(&unknown, dev.path(), &minors).unwrap_err();
        assert!(err.contains("gpu1/gi9/access"), "{err}");
        // Without a driver there is no table, and no capability to show.
        assert_eq!(
            nodes(&mig, dev.path(), &dev.path().join("absent")).unwrap(),
            ["nvidia1", "nvidiactl"]
        );
    }
}
