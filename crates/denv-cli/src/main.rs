//! The `denv` binary; see the `denv_cli` library.

fn main() -> std::process::ExitCode {
    denv_cli::main_with(std::env::args_os())
}
