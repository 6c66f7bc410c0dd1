//! Work on long lists split across the machine's cores: an order-keeping map and a stable
//! sort. The results are those of the sequential loop, element for element, whatever the
//! number of threads (invariant 7: a decision never depends on the machine).
//!
//! Scoped threads of the standard library, started per call: the calls are a few per cycle,
//! each over tens of thousands of elements, where starting a thread costs tens of
//! microseconds. Lists shorter than [`MIN_SPLIT`] stay on the calling thread, so the small
//! problems of tests and a session's arrivals never start one.

use std::cell::Cell;
use std::cmp::Ordering;
use std::sync::OnceLock;

/// Elements below which a list is not split.
const MIN_SPLIT: usize = 4096;

thread_local! {
    /// (threads, elements below which a list is not split) for calls from this thread, in
    /// place of the machine's: see [`splitting_every_list`].
    static OVERRIDE: Cell<Option<(usize, usize)>> = const { Cell::new(None) };
}

/// The threads a split may use: `TESSERA_SOLVER_THREADS` when set to a positive number (an
/// operator's cap, or 1 to keep the solver on one core), else the cores the process may use.
fn machine_threads() -> usize {
    static THREADS: OnceLock<usize> = OnceLock::new();
    *THREADS.get_or_init(|| {
        std::env::var("TESSERA_SOLVER_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
    })
}

/// (threads, elements below which a list is not split) for a call from this thread.
fn config() -> (usize, usize) {
    OVERRIDE
        .get()
        .unwrap_or_else(|| (machine_threads(), MIN_SPLIT))
}

/// Runs `f` with every list of two or more elements split across `threads` threads (at
/// least 2), as if each were long: the solver's tests compare such runs with the sequential
/// ones, on problems far below the size where splitting pays.
pub fn splitting_every_list<R>(threads: usize, f: impl FnOnce() -> R) -> R {
    let before = OVERRIDE.replace(Some((threads.max(2), 2)));
    // Put back on unwinding too, so that a failed assertion does not leak into the next test
    // on this thread.
    struct Restore(Option<(usize, usize)>);
    impl Drop for Restore {
        fn drop(&mut self) {
            OVERRIDE.set(self.0);
        }
    }
    let _restore = Restore(before);
    f()
}

/// Whether work over `len` elements is worth a second thread.
pub(crate) fn large(len: usize) -> bool {
    pieces(len, config()) > 1
}

/// How many pieces a list of `len` elements is cut into.
fn pieces(len: usize, (threads, min): (usize, usize)) -> usize {
    if len < min {
        1
    } else {
        threads.min(len / (min / 2).max(1)).max(1)
    }
}

/// `items.iter().map(f).collect()`, the pieces of a long list mapped on threads of their own.
pub(crate) fn map<T, R, F>(items: &[T], f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
{
    map_with(items, config(), f)
}

fn map_with<T, R, F>(items: &[T], config: (usize, usize), f: F) -> Vec<R>
where
    T: Sync,
    R: Send,
    F: Fn(&T) -> R + Sync,
{
    let pieces = pieces(items.len(), config);
    if pieces == 1 {
        return items.iter().map(&f).collect();
    }
    let size = items.len().div_ceil(pieces);
    let f = &f;
    std::thread::scope(|scope| {
        let mut chunks = items.chunks(size);
        let first = chunks.next().unwrap_or_default();
        let others: Vec<_> = chunks
            .map(|chunk| scope.spawn(move || chunk.iter().map(f).collect::<Vec<R>>()))
            .collect();
        let mut out: Vec<R> = Vec::with_capacity(items.len());
        out.extend(first.iter().map(f));
        for handle in others {
            match handle.join() {
                Ok(part) => out.extend(part),
                // The closure's own panic, carried to the caller as the loop would have it.
                Err(panic) => std::panic::resume_unwind(panic),
            }
        }
        out
    })
}

/// `(aside(), here())`: `aside` on a thread of its own while `here` runs on the calling
/// thread, when the work is `large` and a second core is there; else one after the other.
/// `here` may hold what cannot cross threads (the solver's `Rc`-shared fleet).
pub(crate) fn beside<A, B>(
    large: bool,
    aside: impl FnOnce() -> A + Send,
    here: impl FnOnce() -> B,
) -> (A, B)
where
    A: Send,
{
    if !large || config().0 < 2 {
        let b = here();
        return (aside(), b);
    }
    std::thread::scope(|scope| {
        let handle = scope.spawn(aside);
        let b = here();
        match handle.join() {
            Ok(a) => (a, b),
            Err(panic) => std::panic::resume_unwind(panic),
        }
    })
}

/// `items.sort_by(compare)` (stable), the halves of a long list sorted on two threads and
/// merged, the left half first among equals, as the stable sort of the whole orders them.
pub(crate) fn sort_by<T, C>(items: &mut Vec<T>, compare: C)
where
    T: Send,
    C: Fn(&T, &T) -> Ordering + Sync,
{
    sort_with(items, config(), compare);
}

fn sort_with<T, C>(items: &mut Vec<T>, config: (usize, usize), compare: C)
where
    T: Send,
    C: Fn(&T, &T) -> Ordering + Sync,
{
    if pieces(items.len(), config) == 1 {
        items.sort_by(&compare);
        return;
    }
    let compare = &compare;
    let mid = items.len() / 2;
    let mut right = items.split_off(mid);
    std::thread::scope(|scope| {
        let handle = scope.spawn(|| right.sort_by(compare));
        items.sort_by(compare);
        if let Err(panic) = handle.join() {
            std::panic::resume_unwind(panic);
        }
    });
    let left = std::mem::take(items);
    items.reserve_exact(left.len() + right.len());
    let (mut l, mut r) = (left.into_iter().peekable(), right.into_iter().peekable());
    loop {
        let take_left = match (l.peek(), r.peek()) {
            (Some(a), Some(b)) => compare(b, a) != Ordering::Less,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        let next = if take_left { l.next() } else { r.next() };
        items.extend(next);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        // Long lists with few distinct keys: every tie is one the merge must break as the
        // stable sort does.
        #[test]
        fn sort_is_the_stable_sort(
            keys in proptest::collection::vec(0u8..8, 0..2_000),
            threads in 1usize..5,
        ) {
            let items: Vec<(u8, usize)> = keys.into_iter().zip(0..).collect();
            let mut expected = items.clone();
            expected.sort_by_key(|a| a.0);
            let mut split = items;
            sort_with(&mut split, (threads, 64), |a, b| a.0.cmp(&b.0));
            prop_assert_eq!(split, expected);
        }

        #[test]
        fn map_keeps_the_order(len in 0usize..3_000, threads in 1usize..5) {
            let items: Vec<usize> = (0..len).collect();
            let mapped = map_with(&items, (threads, 64), |&x| x * 3 + 1);
            prop_assert_eq!(mapped, items.iter().map(|&x| x * 3 + 1).collect::<Vec<_>>());
        }
    }

    #[test]
    fn long_lists_are_split_and_short_ones_are_not() {
        let machine = |threads| (threads, MIN_SPLIT);
        assert_eq!(pieces(MIN_SPLIT - 1, machine(8)), 1);
        assert_eq!(pieces(MIN_SPLIT, machine(2)), 2);
        assert_eq!(pieces(100_000, machine(2)), 2);
        assert_eq!(pieces(100_000, machine(1)), 1);
        // Never a piece shorter than half the threshold.
        assert_eq!(pieces(MIN_SPLIT, machine(16)), 2);
        // Every list of two or more, when the tests ask for it.
        splitting_every_list(3, || {
            assert!(!large(1));
            assert!(large(2));
            assert_eq!(pieces(2, config()), 2);
            assert_eq!(pieces(10, config()), 3);
        });
        assert_eq!(config().1, MIN_SPLIT, "the override is put back");
    }

    #[test]
    fn beside_returns_both_in_order() {
        for large in [false, true] {
            let (a, b) = beside(large, || (0..1000u64).sum::<u64>(), || "here");
            assert_eq!((a, b), (499_500, "here"));
        }
    }

    #[test]
    fn a_panic_in_a_piece_reaches_the_caller() {
        let items: Vec<usize> = (0..20_000).collect();
        let caught = std::panic::catch_unwind(|| {
            map_with(&items, (2, 64), |&x| {
                assert!(x != 19_999, "the last element");
                x
            })
        });
        assert!(caught.is_err());
    }
}
