//! The MIG user guide's worked examples, written with H100-80GB names as an
//! operator would, resolved through the catalog.

use tessera_mig::{FitError, Placement, builtin_model, place, validate};

fn ids(names: &[&str]) -> Vec<u32> {
    let h100 = builtin_model("H100-SXM5-80GB").unwrap();
    names
        .iter()
        .map(|n| h100.resolve_profile(n).unwrap_or_else(|| panic!("{n}")))
        .collect()
}

fn p(profile_id: u32, start: u8) -> Placement {
    Placement::new(profile_id, start)
}

#[test]
fn three_g_plus_four_g() {
    let placed = place(&ids(&["3g.40gb", "4g.40gb"])).unwrap();
    assert_eq!(placed, vec![p(5, 0), p(9, 4)]);
    assert_eq!(validate(&placed), Ok(()));
}

#[test]
fn two_three_g_plus_one_g() {
    assert!(matches!(
        place(&ids(&["3g.40gb", "3g.40gb", "1g.10gb"])),
        Err(FitError::NoPlacement { .. })
    ));
}

#[test]
fn three_two_g_plus_one_g() {
    let placed = place(&ids(&["2g.20gb", "2g.20gb", "2g.20gb", "1g.10gb"])).unwrap();
    assert_eq!(placed, vec![p(14, 0), p(14, 2), p(14, 4), p(19, 6)]);
}

#[test]
fn seven_one_g_but_not_eight() {
    assert!(place(&ids(&["1g.10gb"; 7])).is_ok());
    assert!(matches!(
        place(&ids(&["1g.10gb"; 8])),
        Err(FitError::TooMany {
            profile_id: 19,
            count: 8,
            max: 7
        })
    ));
}

#[test]
fn two_four_g() {
    assert!(matches!(
        place(&ids(&["4g.40gb", "4g.40gb"])),
        Err(FitError::TooMany {
            profile_id: 5,
            count: 2,
            max: 1
        })
    ));
}
