//! `denv-cp`: the denv control plane binary (see the library crate docs).

fn main() -> anyhow::Result<()> {
    denv_cp::server::main_entry()
}
