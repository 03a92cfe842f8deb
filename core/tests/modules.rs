//! The crate's modules import each other without circles (issue 45); the checker is shared
//! (dirseal-testfs's modgraph). `--nocapture` prints the graph, bottom layer first.

#[test]
fn modules_form_no_cycles() {
    dirseal_testfs::modgraph::assert_acyclic(std::path::Path::new(env!("CARGO_MANIFEST_DIR")));
}
