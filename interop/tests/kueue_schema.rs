//! The objects `export kueue` writes are what Kueue's API server accepts: each validated against
//! the OpenAPI schema its CRD serves at v1beta2 (strictly: no unknown field), plus the CRDs'
//! CEL rule that a queue without a cohort has no borrowing limit. And `import` reads v1beta1.

mod common;

use serde_json::Value;
use tessera_interop::kueue;

fn exported(example: &str) -> kueue::Export {
    kueue::export(&common::example(example))
}

#[test]
fn every_exported_object_validates_against_its_crd() {
    for example in ["quickstart", "acme"] {
        let export = exported(example);
        assert!(!export.objects.is_empty());
        let mut problems = Vec::new();
        for object in &export.objects {
            assert_eq!(object["apiVersion"], kueue::API_VERSION);
            problems.extend(common::violations(object, "v1beta2"));
            if object["kind"] == "ClusterQueue" && object["spec"]["cohortName"].is_null() {
                // x-kubernetes-validations: "borrowingLimit must be nil when cohort is empty".
                assert!(
                    !serde_json::to_string(object)
                        .unwrap()
                        .contains("borrowingLimit")
                );
            }
        }
        assert!(problems.is_empty(), "{example}:\n{}", problems.join("\n"));
    }
}

#[test]
fn the_schema_check_catches_a_misspelt_field() {
    // The strict schema is what makes the test above mean something.
    let export = exported("quickstart");
    let mut queue = export.of_kind("ClusterQueue").next().unwrap().clone();
    queue["spec"]["cohort"] = queue["spec"]["cohortName"].take();
    queue["spec"].as_object_mut().unwrap().remove("cohortName");
    assert!(!common::violations(&queue, "v1beta2").is_empty());
    let mut flavor = export.of_kind("ResourceFlavor").next().unwrap().clone();
    flavor["spec"]["nodeLabels"] = serde_json::json!(["not", "a", "map"]);
    assert!(!common::violations(&flavor, "v1beta2").is_empty());
}

#[test]
fn the_quickstart_maps_to_a_cohort_two_queues_and_their_flavors() {
    let export = exported("quickstart");
    let names = |kind: &str| -> Vec<String> {
        export
            .of_kind(kind)
            .map(|o| o["metadata"]["name"].as_str().unwrap().to_string())
            .collect()
    };
    assert_eq!(names("Cohort"), ["example"]);
    assert_eq!(names("ClusterQueue"), ["product", "research"]);
    assert_eq!(names("LocalQueue"), ["product", "research"]);
    assert_eq!(names("WorkloadPriorityClass"), ["serving", "research"]);
    assert_eq!(names("ResourceFlavor"), ["h100-train", "h100-infer"]);
    let research = export
        .of_kind("ClusterQueue")
        .find(|o| o["metadata"]["name"] == "research")
        .unwrap();
    assert_eq!(research["spec"]["cohortName"], "example");
    assert_eq!(research["spec"]["fairSharing"]["weight"], "2");
    let train = &research["spec"]["resourceGroups"][0]["flavors"][0];
    assert_eq!(train["name"], "h100-train");
    // Guarantee 12, lending limit 8; its limit, 16, is its parent's: no borrowingLimit.
    assert_eq!(
        train["resources"][0],
        serde_json::json!({"name": "nvidia.com/gpu", "nominalQuota": "12", "lendingLimit": "8"})
    );
    // The root's own nominal quota is its guarantee less its children's: 16 − (12 + 4).
    let root = export.of_kind("Cohort").next().unwrap();
    assert_eq!(
        root["spec"]["resourceGroups"][0]["flavors"][0]["resources"][0]["nominalQuota"],
        "0"
    );
    // The MIG pool: instance counts per profile in a group of their own.
    let mig_group = &research["spec"]["resourceGroups"];
    assert!(mig_group.as_array().unwrap().len() <= 2);
    let subjects: Vec<String> = export.warnings.iter().map(|w| w.to_string()).collect();
    for expected in [
        "trust domains",
        "reservations",
        "decayed fair share",
        "scheduler-chosen MIG geometry",
    ] {
        assert!(
            subjects.iter().any(|w| w.contains(expected)),
            "no warning about {expected}: {subjects:#?}"
        );
    }
}

#[test]
fn v1beta1_objects_are_read() {
    // v1beta1 names a queue's cohort `cohort`, not `cohortName`.
    let objects: Vec<Value> = vec![
        serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ResourceFlavor",
            "metadata": {"name": "a100", "annotations": {
                "tessera.dev/gpu-model": "A100-SXM4-80GB", "tessera.dev/nodes": "4",
                "tessera.dev/gpus-per-node": "8", "tessera.dev/cpu-per-node": "128",
                "tessera.dev/memory-per-node": "1Ti"}},
            "spec": {"nodeLabels": {"gpu": "a100"}}
        }),
        serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
            "metadata": {"name": "team-a"},
            "spec": {"cohort": "org", "namespaceSelector": {},
                     "resourceGroups": [{"coveredResources": ["nvidia.com/gpu", "cpu"], "flavors": [
                         {"name": "a100", "resources": [
                             {"name": "nvidia.com/gpu", "nominalQuota": 8, "borrowingLimit": "8"},
                             {"name": "cpu", "nominalQuota": "64"}]}]}]}
        }),
        serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
            "metadata": {"name": "team-b"},
            "spec": {"cohort": "org", "namespaceSelector": {},
                     "resourceGroups": [{"coveredResources": ["nvidia.com/gpu"], "flavors": [
                         {"name": "a100", "resources": [{"name": "nvidia.com/gpu", "nominalQuota": "24", "lendingLimit": "8"}]}]}]}
        }),
        serde_json::json!({
            "apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "WorkloadPriorityClass",
            "metadata": {"name": "prod"}, "value": 1000
        }),
    ];
    for o in &objects {
        let v = common::violations(o, "v1beta1");
        assert!(v.is_empty(), "{v:?}");
    }
    let import = kueue::import(&[("kueue.yaml".into(), common::as_yaml(&objects))]).unwrap();
    let fleet = &import.fleet;
    // The implicit cohort `org` is the root.
    assert_eq!(fleet.tenants[0].name, "org");
    let org = &fleet.tenants[0].quota["a100"];
    assert_eq!(org.guarantee.to_string(), "32");
    let a = &fleet.tenant("team-a").unwrap().quota["a100"];
    assert_eq!(
        (a.guarantee.to_string(), a.limit.to_string()),
        ("8".into(), "16".into())
    );
    let b = &fleet.tenant("team-b").unwrap().quota["a100"];
    assert_eq!(
        (b.limit.to_string(), b.lending_limit.to_string()),
        ("32".into(), "8".into())
    );
    assert!(
        import
            .warnings
            .iter()
            .any(|w| w.message.contains("\"cpu\""))
    );
    let sources: Vec<_> = import
        .documents
        .iter()
        .enumerate()
        .map(|(i, d)| {
            tessera_compiler::SourceFile::new(
                format!("doc{i}.yaml"),
                serde_json::to_string(d).unwrap(),
            )
        })
        .collect();
    let compilation = tessera_compiler::compile(&sources);
    assert_eq!(compilation.errors(), 0, "{:?}", compilation.diagnostics);
}

#[test]
fn import_errors_name_the_place_and_what_to_fix() {
    let text = "\
apiVersion: kueue.x-k8s.io/v1beta2
kind: ResourceFlavor
metadata:
  name: bare
spec: {}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: ClusterQueue
metadata:
  name: q
spec:
  resourceGroups:
    - coveredResources: [nvidia.com/gpu]
      flavors:
        - name: bare
          resources:
            - name: nvidia.com/gpu
              nominalQuota: 2Ki
";
    let errors = kueue::import(&[("in.yaml".into(), text.into())]).unwrap_err();
    let all: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(
        all.iter()
            .any(|e| e.starts_with("in.yaml:18:") && e.contains("GPU quantity")),
        "{all:#?}"
    );
    let text = text.replace("2Ki", "2");
    let errors = kueue::import(&[("in.yaml".into(), text)]).unwrap_err();
    let all: Vec<String> = errors.iter().map(|e| e.to_string()).collect();
    assert!(
        all.iter()
            .any(|e| e.starts_with("in.yaml:3:") && e.contains("tessera.dev/gpu-model")),
        "{all:#?}"
    );
    let two_roots = "\
apiVersion: kueue.x-k8s.io/v1beta2
kind: Cohort
metadata: {name: a}
---
apiVersion: kueue.x-k8s.io/v1beta2
kind: Cohort
metadata: {name: b}
";
    let errors = kueue::import(&[("r.yaml".into(), two_roots.into())]).unwrap_err();
    assert!(
        errors
            .iter()
            .any(|e| e.message.contains("add a Cohort above them")),
        "{errors:?}"
    );
}
