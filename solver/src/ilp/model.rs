//! A mixed-integer linear program in plain data: variables with bounds, linear constraints, a
//! maximised objective and a starting point. The sub-problem builder writes it; a backend
//! (`backend.rs`) solves it. Keeping it solver-neutral lets the same model go to microlp or
//! HiGHS, and lets the start point be checked before it is offered to either.

use std::collections::BTreeMap;

/// A variable's index in its [`Model`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Var(pub usize);

#[derive(Debug, Clone)]
pub struct VarDef {
    pub lo: f64,
    pub hi: f64,
    pub integer: bool,
    /// Objective coefficient.
    pub gain: f64,
}

/// `Σ coefficient × variable + constant`; a variable appears once (solvers reject repeats).
#[derive(Debug, Clone, Default)]
pub struct Linear {
    pub terms: BTreeMap<Var, f64>,
    pub constant: f64,
}

impl Linear {
    pub fn constant(c: f64) -> Linear {
        Linear {
            terms: BTreeMap::new(),
            constant: c,
        }
    }
    /// `c × v`.
    pub fn term(v: Var, c: f64) -> Linear {
        let mut l = Linear::default();
        l.add(v, c);
        l
    }
    pub fn add(&mut self, v: Var, c: f64) {
        *self.terms.entry(v).or_insert(0.0) += c;
    }
    pub fn add_all(&mut self, other: &Linear, scale: f64) {
        for (&v, &c) in &other.terms {
            self.add(v, c * scale);
        }
        self.constant += other.constant * scale;
    }
    pub fn eval(&self, values: &[f64]) -> f64 {
        self.constant
            + self
                .terms
                .iter()
                .map(|(v, c)| c * values.get(v.0).copied().unwrap_or(0.0))
                .sum::<f64>()
    }
}

/// `expr ≤ 0`.
#[derive(Debug, Clone)]
pub struct Constraint {
    pub terms: Vec<(Var, f64)>,
    pub rhs: f64,
}

#[derive(Debug, Clone, Default)]
pub struct Model {
    pub vars: Vec<VarDef>,
    pub constraints: Vec<Constraint>,
    /// A start point, one value per variable (0 until set).
    pub start: Vec<f64>,
}

impl Model {
    pub fn binary(&mut self, gain: f64) -> Var {
        self.var(0.0, 1.0, true, gain)
    }
    pub fn integer(&mut self, hi: u32, gain: f64) -> Var {
        self.var(0.0, f64::from(hi), true, gain)
    }
    pub fn continuous(&mut self, hi: f64) -> Var {
        self.var(0.0, hi, false, 0.0)
    }
    fn var(&mut self, lo: f64, hi: f64, integer: bool, gain: f64) -> Var {
        self.vars.push(VarDef {
            lo,
            hi,
            integer,
            gain,
        });
        self.start.push(0.0);
        Var(self.vars.len() - 1)
    }

    /// `lhs ≤ rhs`; terms with a zero coefficient are dropped, and a constraint left without
    /// terms is kept only as a check of its constants (see [`Model::trivially_infeasible`]).
    pub fn le(&mut self, lhs: &Linear, rhs: &Linear) {
        let mut e = lhs.clone();
        e.add_all(rhs, -1.0);
        let terms: Vec<(Var, f64)> = e
            .terms
            .into_iter()
            .filter(|(_, c)| c.abs() > 1e-12)
            .collect();
        self.constraints.push(Constraint {
            terms,
            rhs: -e.constant,
        });
    }
    pub fn ge(&mut self, lhs: &Linear, rhs: &Linear) {
        self.le(rhs, lhs);
    }
    pub fn eq(&mut self, lhs: &Linear, rhs: &Linear) {
        self.le(lhs, rhs);
        self.le(rhs, lhs);
    }

    /// A constraint with no variables whose constants already violate it: the model has no
    /// solution, whatever the backend says.
    pub fn trivially_infeasible(&self) -> bool {
        self.constraints
            .iter()
            .any(|c| c.terms.is_empty() && c.rhs < -1e-9)
    }

    pub fn objective(&self, values: &[f64]) -> f64 {
        self.vars.iter().zip(values).map(|(d, x)| d.gain * x).sum()
    }

    /// Whether `values` meets every bound, integrality and constraint (within `tol`).
    pub fn feasible(&self, values: &[f64], tol: f64) -> bool {
        values.len() == self.vars.len()
            && self.vars.iter().zip(values).all(|(d, &x)| {
                x >= d.lo - tol && x <= d.hi + tol && (!d.integer || (x - x.round()).abs() <= tol)
            })
            && self
                .constraints
                .iter()
                .all(|c| c.terms.iter().map(|(v, k)| k * values[v.0]).sum::<f64>() <= c.rhs + tol)
    }
}
