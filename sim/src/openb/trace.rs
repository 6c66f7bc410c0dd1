//! Loading the openb node and pod lists (CSV).
//!
//! Units are the trace's own: CPU in millicores, memory in MiB, GPU in milli-GPU (1 GPU = 1000).
//! Columns are found by header name, so the `multigpu*` pod lists (which only have
//! `name, cpu_milli, memory_mib, num_gpu, gpu_milli`) load with the same code as the full ones.
//!
//! CPU-only pods (`num_gpu == 0`) are kept: the paper's simulator feeds them through the same
//! arrival stream (they take CPU, which later GPU tasks may lack), they count towards the typical
//! task shapes only when that option is on, and they add nothing to the arrived or allocated GPU
//! that the allocation ratio measures.

use std::fmt;
use std::path::{Path, PathBuf};

/// Milli-GPU in one whole GPU.
pub const MILLI: u32 = 1000;

/// One GPU node of the node list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSpec {
    /// `sn` column.
    pub name: String,
    /// CPU capacity in millicores.
    pub cpu_milli: u64,
    /// Memory capacity in MiB.
    pub memory_mib: u64,
    /// Number of GPUs (each 1000 milli-GPU).
    pub num_gpu: u32,
    /// GPU model (`G2`, `T4`, ...); empty for a CPU-only node.
    pub model: String,
}

/// One task (pod) of a pod list.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskSpec {
    pub name: String,
    /// CPU request in millicores.
    pub cpu_milli: u64,
    /// Memory request in MiB.
    pub memory_mib: u64,
    /// Number of GPUs; 0 for a CPU-only task.
    pub num_gpu: u32,
    /// Milli-GPU per GPU: 1..=1000 when `num_gpu == 1`, exactly 1000 when `num_gpu > 1`,
    /// 0 when `num_gpu == 0`.
    pub gpu_milli: u32,
    /// Allowed GPU models (`gpu_spec` split on `|`, empty parts dropped); empty = any model.
    pub gpu_spec: Vec<String>,
    /// `creation_time` in seconds, when the file has it.
    pub creation_time: Option<u64>,
}

impl TaskSpec {
    /// Total GPU request in milli-GPU (`num_gpu × gpu_milli`).
    pub fn gpu_request(&self) -> u64 {
        u64::from(self.num_gpu) * u64::from(self.gpu_milli)
    }
}

/// A problem with a trace file; each names the file, and a bad row its line (1-based, the
/// header being line 1).
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error("{}: cannot read: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: the file is empty (no header line)", path.display())]
    Empty { path: PathBuf },
    #[error("{}:1: missing column `{column}` in the header", path.display())]
    MissingColumn { path: PathBuf, column: &'static str },
    #[error("{}:{line}: {message}", path.display())]
    BadRow {
        path: PathBuf,
        line: usize,
        message: String,
    },
}

/// Reads a node list (`sn, cpu_milli, memory_mib, gpu, model`).
pub fn load_nodes(path: impl AsRef<Path>) -> Result<Vec<NodeSpec>, TraceError> {
    let path = path.as_ref();
    let text = read(path)?;
    parse_nodes(path, &text)
}

/// Reads a pod list (`name, cpu_milli, memory_mib, num_gpu, gpu_milli` and optionally
/// `gpu_spec`, `creation_time`, ...).
pub fn load_tasks(path: impl AsRef<Path>) -> Result<Vec<TaskSpec>, TraceError> {
    let path = path.as_ref();
    let text = read(path)?;
    parse_tasks(path, &text)
}

/// Parses node-list CSV text; `path` is only used in errors.
pub fn parse_nodes(path: &Path, text: &str) -> Result<Vec<NodeSpec>, TraceError> {
    let mut csv = Csv::new(path, text)?;
    let c_name = csv.column("sn")?;
    let c_cpu = csv.column("cpu_milli")?;
    let c_mem = csv.column("memory_mib")?;
    let c_gpu = csv.column("gpu")?;
    let c_model = csv.column("model")?;
    let mut out = Vec::new();
    while let Some(row) = csv.next_row()? {
        let name = row.text(c_name)?.to_string();
        if name.is_empty() {
            return Err(row.error("empty node name (`sn`)"));
        }
        let num_gpu = row.int(c_gpu, "gpu")?;
        let num_gpu = u32::try_from(num_gpu).map_err(|_| row.error("`gpu` is too large"))?;
        let model = row.text(c_model)?.to_string();
        if num_gpu > 0 && model.is_empty() {
            return Err(row.error("a node with GPUs needs a `model`"));
        }
        out.push(NodeSpec {
            name,
            cpu_milli: row.int(c_cpu, "cpu_milli")?,
            memory_mib: row.int(c_mem, "memory_mib")?,
            num_gpu,
            model,
        });
    }
    Ok(out)
}

/// Parses pod-list CSV text; `path` is only used in errors.
pub fn parse_tasks(path: &Path, text: &str) -> Result<Vec<TaskSpec>, TraceError> {
    let mut csv = Csv::new(path, text)?;
    let c_name = csv.column("name")?;
    let c_cpu = csv.column("cpu_milli")?;
    let c_mem = csv.column("memory_mib")?;
    let c_num = csv.column("num_gpu")?;
    let c_milli = csv.column("gpu_milli")?;
    let c_spec = csv.optional_column("gpu_spec");
    let c_time = csv.optional_column("creation_time");
    let mut out = Vec::new();
    while let Some(row) = csv.next_row()? {
        let name = row.text(c_name)?.to_string();
        let num_gpu = row.int(c_num, "num_gpu")?;
        let num_gpu = u32::try_from(num_gpu).map_err(|_| row.error("`num_gpu` is too large"))?;
        let gpu_milli = row.int(c_milli, "gpu_milli")?;
        let gpu_milli = match (num_gpu, gpu_milli) {
            (0, 0) => 0,
            (0, m) => {
                return Err(row.error(&format!(
                    "`gpu_milli` is {m} but `num_gpu` is 0 (a CPU-only task asks no GPU)"
                )));
            }
            (1, m @ 1..=1000) => m as u32,
            (1, m) => {
                return Err(row.error(&format!(
                    "`gpu_milli` must be in 1..=1000 for a one-GPU task, found {m}"
                )));
            }
            (_, 1000) => MILLI,
            (n, m) => {
                return Err(row.error(&format!(
                    "a task with {n} GPUs must take whole GPUs (`gpu_milli` 1000), found {m}"
                )));
            }
        };
        let gpu_spec = match c_spec {
            Some(c) => row
                .text(c)?
                .split('|')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(str::to_string)
                .collect(),
            None => Vec::new(),
        };
        let creation_time = match c_time {
            Some(c) if !row.text(c)?.is_empty() => Some(row.int(c, "creation_time")?),
            _ => None,
        };
        out.push(TaskSpec {
            name,
            cpu_milli: row.int(c_cpu, "cpu_milli")?,
            memory_mib: row.int(c_mem, "memory_mib")?,
            num_gpu,
            gpu_milli,
            gpu_spec,
            creation_time,
        });
    }
    Ok(out)
}

fn read(path: &Path) -> Result<String, TraceError> {
    std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// A minimal CSV reader for these files: comma-separated, no quoting (the openb files have
/// none; a quote character is rejected rather than misread), blank lines skipped, `\r\n` allowed.
struct Csv<'a> {
    path: &'a Path,
    header: Vec<&'a str>,
    lines: std::iter::Enumerate<std::str::Lines<'a>>,
}

impl<'a> Csv<'a> {
    fn new(path: &'a Path, text: &'a str) -> Result<Self, TraceError> {
        let mut lines = text.lines().enumerate();
        let header = loop {
            match lines.next() {
                Some((_, l)) if l.trim().is_empty() => continue,
                Some((_, l)) => break l,
                None => {
                    return Err(TraceError::Empty {
                        path: path.to_path_buf(),
                    });
                }
            }
        };
        let header = header
            .trim_start_matches('\u{feff}')
            .split(',')
            .map(str::trim)
            .collect();
        Ok(Self {
            path,
            header,
            lines,
        })
    }

    fn optional_column(&self, name: &str) -> Option<usize> {
        self.header.iter().position(|h| *h == name)
    }

    fn column(&self, name: &'static str) -> Result<usize, TraceError> {
        self.optional_column(name)
            .ok_or_else(|| TraceError::MissingColumn {
                path: self.path.to_path_buf(),
                column: name,
            })
    }

    fn next_row(&mut self) -> Result<Option<Row<'a>>, TraceError> {
        for (i, line) in self.lines.by_ref() {
            if line.trim().is_empty() {
                continue;
            }
            let row = Row {
                path: self.path,
                line: i + 1,
                fields: line.split(',').map(str::trim).collect(),
            };
            if line.contains('"') {
                return Err(row.error("quoted fields are not supported"));
            }
            if row.fields.len() != self.header.len() {
                return Err(row.error(&format!(
                    "expected {} fields (as in the header), found {}",
                    self.header.len(),
                    row.fields.len()
                )));
            }
            return Ok(Some(row));
        }
        Ok(None)
    }
}

struct Row<'a> {
    path: &'a Path,
    line: usize,
    fields: Vec<&'a str>,
}

impl<'a> Row<'a> {
    fn error(&self, message: &str) -> TraceError {
        TraceError::BadRow {
            path: self.path.to_path_buf(),
            line: self.line,
            message: message.to_string(),
        }
    }

    fn text(&self, column: usize) -> Result<&'a str, TraceError> {
        Ok(self.fields[column])
    }

    fn int(&self, column: usize, name: &str) -> Result<u64, TraceError> {
        let raw = self.fields[column];
        parse_uint(raw).ok_or_else(|| {
            self.error(&format!(
                "`{name}` must be a non-negative integer, found {:?}",
                raw
            ))
        })
    }
}

/// Accepts `123` and also `123.0` (pandas writes integer columns with missing values as floats).
fn parse_uint(raw: &str) -> Option<u64> {
    if let Ok(v) = raw.parse::<u64>() {
        return Some(v);
    }
    let (int, frac) = raw.split_once('.')?;
    if !frac.is_empty() && frac.bytes().all(|b| b == b'0') {
        int.parse::<u64>().ok()
    } else {
        None
    }
}

impl fmt::Display for NodeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ({}m CPU, {} x {})",
            self.name, self.cpu_milli, self.num_gpu, self.model
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NODES: &str = "sn,cpu_milli,memory_mib,gpu,model\n\
                         n0,64000,262144,2,P100\n\
                         n1,96000,393216,8,G2\n";

    #[test]
    fn parses_nodes() {
        let nodes = parse_nodes(Path::new("nodes.csv"), NODES).unwrap();
        assert_eq!(nodes.len(), 2);
        assert_eq!(nodes[1].num_gpu, 8);
        assert_eq!(nodes[1].model, "G2");
        assert_eq!(nodes[0].cpu_milli, 64_000);
    }

    #[test]
    fn parses_full_and_short_pod_lists() {
        let full = "name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,qos,pod_phase,creation_time,deletion_time,scheduled_time\n\
                    p0,12000,16384,1,460,,LS,Running,7,9,7\n\
                    p1,4000,1024,0,0,T4|P100,BE,Running,3,9,3\n\
                    p2,4000,1024,2,1000,|V100M16|,BE,Running,,9,3\n";
        let t = parse_tasks(Path::new("pods.csv"), full).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].gpu_milli, 460);
        assert_eq!(t[0].gpu_spec, Vec::<String>::new());
        assert_eq!(t[0].creation_time, Some(7));
        assert_eq!(t[1].gpu_spec, vec!["T4".to_string(), "P100".to_string()]);
        assert_eq!(t[1].gpu_request(), 0);
        assert_eq!(t[2].gpu_spec, vec!["V100M16".to_string()]);
        assert_eq!(t[2].creation_time, None);
        assert_eq!(t[2].gpu_request(), 2000);

        let short = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,12000,16384,8,1000\n";
        let t = parse_tasks(Path::new("multi.csv"), short).unwrap();
        assert_eq!(t[0].num_gpu, 8);
        assert_eq!(t[0].gpu_spec, Vec::<String>::new());
        assert_eq!(t[0].creation_time, None);
    }

    #[test]
    fn bad_rows_name_file_and_line() {
        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1,500\np1,x,1,1,500\n";
        let err = parse_tasks(Path::new("pods.csv"), text).unwrap_err();
        let msg = err.to_string();
        assert!(msg.starts_with("pods.csv:3: `cpu_milli`"), "{msg}");

        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,2,500\n";
        let msg = parse_tasks(Path::new("pods.csv"), text)
            .unwrap_err()
            .to_string();
        assert!(
            msg.starts_with("pods.csv:2:") && msg.contains("whole GPUs"),
            "{msg}"
        );

        let text = "name,cpu_milli,memory_mib,num_gpu,gpu_milli\np0,1,1,1\n";
        let msg = parse_tasks(Path::new("pods.csv"), text)
            .unwrap_err()
            .to_string();
        assert!(msg.contains("pods.csv:2: expected 5 fields"), "{msg}");

        let text = "name,cpu_milli,memory_mib,gpu_milli\np0,1,1,1\n";
        let msg = parse_tasks(Path::new("pods.csv"), text)
            .unwrap_err()
            .to_string();
        assert_eq!(msg, "pods.csv:1: missing column `num_gpu` in the header");

        let err = load_nodes("/nonexistent/dir/nodes.csv").unwrap_err();
        assert!(matches!(err, TraceError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/dir/nodes.csv"));
    }
}
