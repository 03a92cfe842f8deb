//! The `dirseal` command: clap, prompts and progress bars over the core library (`dirseal`, in core/).
#![forbid(unsafe_code)]

mod cli;

fn main() {
    std::process::exit(cli::main());
}
