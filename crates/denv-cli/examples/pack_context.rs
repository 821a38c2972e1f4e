//! Writes to stdout the tar `denv deploy` sends for one build context of a compose file:
//! the bytes of [`denv_cli::context::contexts_for`], `.dockerignore` applied.
//!
//! ```text
//! cargo run -q -p denv-cli --example pack_context -- compose.yaml ./app > app.tar
//! ```
//!
//! The Python package's tests compare `denv.client.build_contexts` against it.

use std::io::Write;
use std::path::Path;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [file, context] = args.as_slice() else {
        anyhow::bail!("usage: pack_context <compose file> <context as written>");
    };
    let text = std::fs::read_to_string(file)?;
    let dir = Path::new(file)
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let contexts = denv_cli::context::contexts_for(&text, dir)?;
    let Some(tar) = contexts.get(context) else {
        anyhow::bail!("no service of {file} builds from context {context:?}");
    };
    std::io::stdout().write_all(tar)?;
    Ok(())
}
