//! A driver wrapped so that a hook runs at each of its observations, every other call passed on
//! unchanged: how a benchmark gives simulated GPUs a load to report, or a test acts while a cycle
//! observes, without writing out every [`NodeDriver`] method again.

use super::{ComputeInstanceInfo, DriverError, GpuRef, NodeDriver, Observation};

/// `inner`, with `hook` run on each observation it makes. A failed observation is returned as
/// it failed, without the hook.
pub struct ObserveHook<D, F> {
    inner: D,
    hook: F,
}

impl<D, F> ObserveHook<D, F>
where
    D: NodeDriver,
    F: FnMut(&mut Observation) + Send,
{
    pub fn new(inner: D, hook: F) -> ObserveHook<D, F> {
        ObserveHook { inner, hook }
    }
}

impl<D, F> NodeDriver for ObserveHook<D, F>
where
    D: NodeDriver,
    F: FnMut(&mut Observation) + Send,
{
    fn kind(&self) -> &'static str {
        self.inner.kind()
    }

    fn observe(&mut self) -> Result<Observation, DriverError> {
        let mut observation = self.inner.observe()?;
        (self.hook)(&mut observation);
        Ok(observation)
    }

    fn set_mig_mode(&mut self, gpu: &GpuRef, enabled: bool) -> Result<(), DriverError> {
        self.inner.set_mig_mode(gpu, enabled)
    }

    fn reset_gpu(&mut self, gpu: &GpuRef) -> Result<(), DriverError> {
        self.inner.reset_gpu(gpu)
    }

    fn create_gpu_instance(
        &mut self,
        gpu: &GpuRef,
        profile_id: u32,
        start: u8,
    ) -> Result<u32, DriverError> {
        self.inner.create_gpu_instance(gpu, profile_id, start)
    }

    fn destroy_gpu_instance(&mut self, gpu: &GpuRef, gpu_instance: u32) -> Result<(), DriverError> {
        self.inner.destroy_gpu_instance(gpu, gpu_instance)
    }

    fn create_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
    ) -> Result<ComputeInstanceInfo, DriverError> {
        self.inner.create_compute_instance(gpu, gpu_instance)
    }

    fn destroy_compute_instance(
        &mut self,
        gpu: &GpuRef,
        gpu_instance: u32,
        compute_instance: u32,
    ) -> Result<(), DriverError> {
        self.inner
            .destroy_compute_instance(gpu, gpu_instance, compute_instance)
    }

    fn process_started(&mut self, pid: u32, gpu: &GpuRef, gpu_instance: Option<u32>) {
        self.inner.process_started(pid, gpu, gpu_instance);
    }

    fn process_ended(&mut self, pid: u32) {
        self.inner.process_ended(pid);
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::driver::sim::SimDriver;
    use crate::driver::{GpuInstanceInfo, GpuUtilization};

    fn quickstart(dir: &Path) -> SimDriver {
        let nodes = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../examples/policies/quickstart/cluster-state.yaml");
        SimDriver::open(&nodes, &dir.join("sim.json")).unwrap()
    }

    fn busy(observation: &mut Observation) {
        for detail in &mut observation.details {
            detail.utilization = Some(GpuUtilization {
                gpu_percent: 42,
                memory_percent: 7,
            });
        }
    }

    /// Undoes and redoes the 1g instance at slice 2 of `infer-0`'s GPU 0, first while a
    /// process holds it, and turns MIG on for `train-0`'s GPU 0: each call's answer, in order.
    fn exercise(driver: &mut dyn NodeDriver, mig: &GpuRef, gi: &GpuInstanceInfo) -> Vec<String> {
        let ci = gi.compute_instances[0].id;
        let whole = GpuRef {
            node: "train-0".into(),
            index: 0,
        };
        driver.process_started(7, mig, Some(gi.id));
        let held = driver.destroy_compute_instance(mig, gi.id, ci);
        driver.process_ended(7);
        vec![
            format!("{held:?}"),
            format!("{:?}", driver.destroy_compute_instance(mig, gi.id, ci)),
            format!("{:?}", driver.destroy_gpu_instance(mig, gi.id)),
            format!("{:?}", driver.create_gpu_instance(mig, gi.profile_id, 2)),
            format!("{:?}", driver.set_mig_mode(&whole, true)),
            driver.kind().to_owned(),
        ]
    }

    fn at_slice_2(observation: &Observation, gpu: &GpuRef) -> GpuInstanceInfo {
        let detail = observation.details.iter().find(|d| d.gpu == *gpu).unwrap();
        let gi = detail.instances.iter().find(|i| i.start == 2).unwrap();
        gi.clone()
    }

    /// The same calls on the wrapped driver and on a plain one give the same answers, and the
    /// same observations once the hook is applied to the plain one's: every call reaches the
    /// inner driver, and only observations are touched.
    #[test]
    fn every_call_is_passed_on_and_only_observations_are_hooked() {
        let (a, b) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let mut observed = 0;
        let mut hooked = ObserveHook::new(quickstart(a.path()), |o: &mut Observation| {
            observed += 1;
            busy(o);
        });
        let mut plain = quickstart(b.path());
        let mig = GpuRef {
            node: "infer-0".into(),
            index: 0,
        };
        let gi = at_slice_2(&plain.observe().unwrap(), &mig);
        let answers = exercise(&mut hooked, &mig, &gi);
        assert_eq!(answers, exercise(&mut plain, &mig, &gi));
        assert!(answers[0].starts_with("Err"), "{answers:?}");
        assert!(
            answers[1..5].iter().all(|a| a.starts_with("Ok")),
            "{answers:?}"
        );

        let mut expected = plain.observe().unwrap();
        // Made again without its compute instance.
        assert!(at_slice_2(&expected, &mig).compute_instances.is_empty());
        busy(&mut expected);
        let got = hooked.observe().unwrap();
        assert_eq!(
            serde_json::to_value(&got.details).unwrap(),
            serde_json::to_value(&expected.details).unwrap()
        );
        assert_eq!(got.nodes, expected.nodes);
        drop(hooked);
        assert_eq!(observed, 1);
    }
}
