//! The `dirseal` binary: everything lives in the library and the `cli` glue.
#![forbid(unsafe_code)]

mod cli;

fn main() {
    std::process::exit(cli::main());
}
