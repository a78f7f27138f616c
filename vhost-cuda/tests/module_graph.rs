//! No circle of imports in vhost-cuda: files of one folder, or folders of one parent (each taken
//! whole, its `mod.rs` included), that reach each other through their imports. One reader serves
//! guest-lib's test of the same name: `tests/rust/module_graph.rs` at the top of the repository.
//!
//! Test-only code (`tests`, the `fake*` CUDA drivers, `#[cfg(test)]` items, what only the
//! `fuzzing` and `test-hooks` features build) is not read.

#[path = "../../tests/rust/module_graph.rs"]
mod module_graph;

use std::path::Path;

use module_graph::{circles, Crate};

#[test]
fn no_modules_of_vhost_cuda_import_each_other_in_a_circle() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut text = String::new();
    let mut count = 0;
    for root in ["lib.rs", "main.rs", "bin/vhost-cuda-frontend-bench/main.rs"] {
        let krate = Crate::load(&src.join(root));
        assert!(
            krate.modules.len() > 1 || root != "lib.rs",
            "src/lib.rs has no modules"
        );
        for c in circles(&krate.edges()) {
            count += 1;
            text += &format!("[{root}] {c}");
        }
    }
    assert!(
        count == 0,
        "{count} circles of imports in vhost-cuda/src (a module that a module it uses also \
         uses, directly or through others: give the lower one what it needs as an argument):\n\
         {text}"
    );
}
