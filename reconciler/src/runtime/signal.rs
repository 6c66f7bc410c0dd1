//! The signals a workload can be asked to checkpoint (or stop) with.
//!
//! Only catchable signals whose default action ends the process are accepted: the runtime's
//! wrapper traps exactly these so that it outlives the command and records how it ended
//! (`SIGKILL` is [`super::Runtime::kill`], not a checkpoint signal).

/// A checkpoint signal, named as SLO classes name it (`SIGUSR1`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Signal {
    Hup,
    Int,
    Quit,
    Usr1,
    Usr2,
    Alrm,
    Term,
}

impl Signal {
    pub const ALL: [Signal; 7] = [
        Signal::Hup,
        Signal::Int,
        Signal::Quit,
        Signal::Usr1,
        Signal::Usr2,
        Signal::Alrm,
        Signal::Term,
    ];

    /// Parses `SIGUSR1`-style names (the form `SloClass.preemption.signal` takes).
    pub fn parse(name: &str) -> Result<Signal, super::RuntimeError> {
        Signal::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| super::RuntimeError::UnknownSignal(name.to_string()))
    }

    /// `SIGUSR1`.
    pub fn name(self) -> &'static str {
        match self {
            Signal::Hup => "SIGHUP",
            Signal::Int => "SIGINT",
            Signal::Quit => "SIGQUIT",
            Signal::Usr1 => "SIGUSR1",
            Signal::Usr2 => "SIGUSR2",
            Signal::Alrm => "SIGALRM",
            Signal::Term => "SIGTERM",
        }
    }

    /// The names accepted, for error messages.
    pub fn names() -> String {
        Signal::ALL.map(Signal::name).join(", ")
    }

    pub(super) fn to_nix(self) -> nix::sys::signal::Signal {
        use nix::sys::signal::Signal as N;
        match self {
            Signal::Hup => N::SIGHUP,
            Signal::Int => N::SIGINT,
            Signal::Quit => N::SIGQUIT,
            Signal::Usr1 => N::SIGUSR1,
            Signal::Usr2 => N::SIGUSR2,
            Signal::Alrm => N::SIGALRM,
            Signal::Term => N::SIGTERM,
        }
    }
}

impl std::fmt::Display for Signal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}
