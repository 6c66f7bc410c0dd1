//! Counts in running text: "1 replica", "2 replicas".

/// `n` followed by the noun, plural unless `n` is one.
pub fn count(n: usize, one: &str, many: &str) -> String {
    if n == 1 {
        format!("1 {one}")
    } else {
        format!("{n} {many}")
    }
}

#[cfg(test)]
mod tests {
    use super::count;

    #[test]
    fn one_is_singular_and_every_other_count_plural() {
        assert_eq!(count(0, "replica", "replicas"), "0 replicas");
        assert_eq!(count(1, "replica", "replicas"), "1 replica");
        assert_eq!(count(2, "replica", "replicas"), "2 replicas");
    }
}
