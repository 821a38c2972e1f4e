//! Property tests: the parser never panics, on arbitrary text and on mutations of the
//! spec's examples, and every spec it accepts keeps the documented invariants.

use denv_compose::{is_root_user, parse, Spec};
use proptest::prelude::*;

const FIXTURES: &[&str] = &[
    include_str!("fixtures/quickstart.compose.yaml"),
    include_str!("fixtures/compose-reference.example.yaml"),
    include_str!("fixtures/creating-an-environment.compose.yaml"),
    include_str!("fixtures/karotte.compose.yaml"),
    include_str!("fixtures/verify-howto.x-denv.yaml"),
];

/// Tokens that mean something in YAML or to the parser.
const TOKENS: &[&str] = &[
    ":",
    "- ",
    " ",
    "\n",
    "\n  ",
    "[",
    "]",
    "{",
    "}",
    "\"",
    "'",
    ",",
    "&a ",
    "*a",
    "<<: *a",
    "!reset ",
    "!!str ",
    "#",
    "\t",
    "0",
    "-1",
    "/",
    "./",
    "..",
    "~",
    "host",
    "true",
    "null",
    "NONE",
    "CMD",
    "ro",
    "root",
    "1e999",
    ".nan",
    "99999999999999999999",
    "µs",
    "é",
    "\u{0}",
    "---\n",
    "%YAML 1.2\n",
    "? ",
    "|\n",
    ">\n",
    "\\",
    "$",
    "8080:80/udp",
];

/// Invariants of any accepted spec (module docs of `parse.rs`).
fn check(spec: &Spec) {
    assert!(!spec.services.is_empty());
    assert!(spec.services.windows(2).all(|w| w[0].name < w[1].name));
    assert!(spec.volumes.windows(2).all(|w| w[0] < w[1]));
    for s in &spec.services {
        assert!(!s.image.is_empty());
        assert!(s.resources.memory_mb > 0 && s.resources.pids > 0 && s.resources.cpus > 0.0);
        assert!(s.ports.iter().all(|p| *p != 0));
        for v in &s.volumes {
            assert!(spec.volumes.contains(&v.name));
            assert!(v.path.starts_with('/'));
        }
        for d in &s.depends_on {
            assert!(spec.service(d).is_some());
        }
        if let Some(h) = &s.health {
            assert!(h.interval_ms > 0 && h.retries > 0);
            assert!(h.test[0] == "CMD" || h.test[0] == "CMD-SHELL");
        }
    }
    if let Some(agent) = &spec.agent {
        let user = &spec
            .service(&agent.service)
            .expect("agent service exists")
            .user;
        assert!(!is_root_user(user));
    }
    if let Some(v) = &spec.verifier {
        assert!(spec.agent.is_some());
        assert!(v.image.is_some() != v.service.is_some());
        assert!(!v.command.is_empty() && v.timeout_sec > 0);
        assert!(v.collect.iter().all(|p| p.starts_with('/')));
    }
    let json = serde_json::to_string(spec).expect("serialise");
    let back: Spec = serde_json::from_str(&json).expect("deserialise");
    assert_eq!(&back, spec);
}

fn run(text: &str) {
    match parse(text) {
        Ok(spec) => check(&spec),
        Err(e) => assert!(e.to_string().starts_with("compose: "), "{e}"),
    }
}

#[derive(Debug, Clone)]
enum Edit {
    Insert(usize, usize),
    Delete(usize, usize),
    DuplicateLine(usize),
    DeleteLine(usize),
    SwapLines(usize, usize),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        (any::<usize>(), 0..TOKENS.len()).prop_map(|(at, t)| Edit::Insert(at, t)),
        (any::<usize>(), 1usize..8).prop_map(|(at, n)| Edit::Delete(at, n)),
        any::<usize>().prop_map(Edit::DuplicateLine),
        any::<usize>().prop_map(Edit::DeleteLine),
        (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Edit::SwapLines(a, b)),
    ]
}

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut chars: Vec<char> = text.chars().collect();
    for e in edits {
        match e {
            Edit::Insert(at, t) => {
                let at = at % (chars.len() + 1);
                chars.splice(at..at, TOKENS[*t].chars());
            }
            Edit::Delete(at, n) => {
                if !chars.is_empty() {
                    let at = at % chars.len();
                    let end = (at + n).min(chars.len());
                    chars.drain(at..end);
                }
            }
            Edit::DuplicateLine(i) | Edit::DeleteLine(i) | Edit::SwapLines(i, _) => {
                let s: String = chars.iter().collect();
                let mut lines: Vec<String> = s.lines().map(str::to_string).collect();
                if lines.is_empty() {
                    continue;
                }
                let i = i % lines.len();
                match e {
                    Edit::DuplicateLine(_) => {
                        let l = lines[i].clone();
                        lines.insert(i, l);
                    }
                    Edit::DeleteLine(_) => {
                        lines.remove(i);
                    }
                    Edit::SwapLines(_, j) => {
                        let j = j % lines.len();
                        lines.swap(i, j);
                    }
                    _ => {}
                }
                chars = (lines.join("\n") + "\n").chars().collect();
            }
        }
    }
    chars.into_iter().collect()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(600))]

    #[test]
    fn arbitrary_text_never_panics(text in "\\PC*") {
        run(&text);
    }

    #[test]
    fn arbitrary_yamlish_text_never_panics(text in "([a-z_:\\- \\n\\[\\]{}\"'&*!#0-9./]|services|image|volumes|x-denv|agent|verifier){0,200}") {
        run(&text);
    }

    #[test]
    fn mutated_examples_never_panic(f in 0..FIXTURES.len(), edits in prop::collection::vec(edit(), 1..6)) {
        run(&apply(FIXTURES[f], &edits));
    }
}

#[test]
fn unmutated_examples_keep_the_invariants() {
    for f in &FIXTURES[..4] {
        check(&parse(f).expect("example parses"));
    }
}
