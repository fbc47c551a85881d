//! The crate's README (its page on crates.io) lists every feature of `Cargo.toml`, each as
//! available: the table once called built stores "planned" or "in progress".

/// The features `Cargo.toml` declares, but `default`.
fn manifest_features() -> Vec<String> {
    let manifest = include_str!("../Cargo.toml");
    // No `[features]` section reads as no features, which the test then reports.
    let section = manifest.split("[features]").nth(1).unwrap_or_default();
    section
        .lines()
        .skip(1)
        .take_while(|line| !line.starts_with('['))
        .filter_map(|line| line.split_once('=').map(|(name, _)| name.trim().to_owned()))
        .filter(|name| !name.is_empty() && !name.starts_with('#') && name != "default")
        .collect()
}

/// The README's feature table: each row's feature name and the rest of the row.
fn readme_rows() -> Vec<(String, String)> {
    include_str!("../README.md")
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|row| row.split_once("` |"))
        .map(|(name, rest)| (name.to_owned(), rest.to_owned()))
        .collect()
}

#[test]
fn the_readme_lists_every_feature_as_available() {
    let features = manifest_features();
    assert_eq!(features.len(), 7, "{features:?}");
    let rows = readme_rows();
    let names: Vec<&str> = rows.iter().map(|(name, _)| name.as_str()).collect();
    assert_eq!(names, features, "the README's feature table");
    for (name, row) in &rows {
        for stale in ["planned", "in progress", "issue "] {
            assert!(
                !row.contains(stale),
                "the README says {stale:?} of the feature {name}: {row}"
            );
        }
        assert!(row.contains("idem::"), "{name}: {row}");
    }
}
