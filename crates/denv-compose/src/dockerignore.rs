//! `.dockerignore`: which paths of a build context are left out of the tar a client
//! uploads (`13-ref-compose.md`, "Builds"). Pure code, no I/O: the file's text in, a
//! [`DockerIgnore`] out, asked about slash-separated paths relative to the context root.
//!
//! The semantics are Docker's (moby's `patternmatcher` and `ignorefile`, and the docker
//! CLI's build-context rules), so a context sends what `docker build` would:
//!
//! - One pattern a line. A line whose first character is `#` is a comment; the others
//!   are trimmed, and blank ones skipped. A leading `!` makes the pattern an exception.
//!   The pattern is cleaned like Go's `filepath.Clean` (`./a//b/` is `a/b`, `a/../b` is
//!   `b`) and a leading `/` is dropped: every pattern is relative to the context root.
//! - `*` matches any run of characters but `/`, `?` one character but `/`, `[...]` a class
//!   as in Go's `filepath.Match` (`[^...]` negates, `\` escapes), `\c` the character `c`;
//!   `**` matches any number of directories (`**/x`, `a/**/x`, `a/**`).
//! - A path is excluded when the *last* pattern that matches it, or matches one of its
//!   parent directories, is not an exception. So `dir` leaves out everything below
//!   `dir`, and a later `!dir/keep.txt` sends that one file again.
//! - [`DockerIgnore::keep`] names paths sent whatever the patterns say: the docker CLI
//!   always sends the Dockerfile in use and `.dockerignore` itself.
//!
//! ```
//! use denv_compose::dockerignore::DockerIgnore;
//! let ig = DockerIgnore::for_build("# no VCS\n.git\n*.log\n!keep.log\n", &["Dockerfile"]).unwrap();
//! assert!(ig.is_excluded(".git/config"));
//! assert!(ig.is_excluded("debug.log") && !ig.is_excluded("keep.log"));
//! assert!(!ig.is_excluded("sub/debug.log")); // `*` does not cross `/`
//! ```

use regex::Regex;

/// The file read at the context root.
pub const FILE_NAME: &str = ".dockerignore";

/// A line of a `.dockerignore` that does not parse. `Display`:
/// `line <n>: pattern "<pattern>" does not parse: <reason>` (a client puts the file's
/// path in front).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: pattern \"{pattern}\" does not parse: {reason}")]
pub struct PatternError {
    /// 1-based line number in the file.
    pub line: usize,
    /// The line as written, trimmed.
    pub pattern: String,
    /// What is wrong with it (e.g. `unclosed character class`).
    pub reason: String,
}

/// The patterns of one `.dockerignore` plus the paths always kept. Cheap to query;
/// build it once per context.
#[derive(Debug, Clone, Default)]
pub struct DockerIgnore {
    patterns: Vec<Pattern>,
    kept: Vec<String>,
}

#[derive(Debug, Clone)]
struct Pattern {
    /// Cleaned, without the `!`.
    text: String,
    exception: bool,
    matcher: Matcher,
}

/// moby's four ways of matching one pattern: a pattern without wildcards compares
/// whole strings, `lit**` compares a prefix, `**lit` a suffix, the rest is a regex.
#[derive(Debug, Clone)]
enum Matcher {
    Exact,
    Prefix(String),
    Suffix(String),
    Regex(Regex),
}

impl DockerIgnore {
    /// The patterns of a `.dockerignore` file's text (a UTF-8 byte order mark at its
    /// start is skipped). An empty text excludes nothing.
    ///
    /// Errors: the first line whose pattern does not parse (an unclosed or empty `[...]`,
    /// a `\` at the end, a bad range, `!` alone), as a [`PatternError`].
    pub fn parse(text: &str) -> Result<Self, PatternError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut patterns = Vec::new();
        for (i, raw) in text.lines().enumerate() {
            // ignorefile.ReadAll: comments are recognised before trimming.
            if raw.starts_with('#') {
                continue;
            }
            let line = raw.trim();
            if line.is_empty() {
                continue;
            }
            let err = |reason: &str| PatternError {
                line: i + 1,
                pattern: line.to_string(),
                reason: reason.to_string(),
            };
            let (exception, rest) = match line.strip_prefix('!') {
                Some(r) => (true, r.trim()),
                None => (false, line),
            };
            let mut p = if rest.is_empty() {
                String::new()
            } else {
                clean(rest)
            };
            if p.len() > 1 && p.starts_with('/') {
                p.remove(0);
            }
            // patternmatcher.New cleans the whole line again, `!` included.
            let full = clean(&if exception { format!("!{p}") } else { p });
            let (exception, text) = match full.strip_prefix('!') {
                Some("") => return Err(err("an exception (!) needs a pattern after it")),
                Some(r) => (true, r.to_string()),
                None => (false, full),
            };
            let matcher = compile(&text).map_err(|r| err(&r))?;
            patterns.push(Pattern {
                text,
                exception,
                matcher,
            });
        }
        Ok(DockerIgnore {
            patterns,
            kept: Vec::new(),
        })
    }

    /// [`parse`](Self::parse), then [`keep`](Self::keep) `.dockerignore` and each of
    /// `dockerfiles` (paths relative to the context, as in compose's
    /// `build.dockerfile`), as `docker build` does.
    pub fn for_build(text: &str, dockerfiles: &[&str]) -> Result<Self, PatternError> {
        let mut ig = Self::parse(text)?;
        ig.keep(FILE_NAME);
        for d in dockerfiles {
            ig.keep(d);
        }
        Ok(ig)
    }

    /// Always sends `path` (relative to the context; cleaned, so `./Dockerfile` is
    /// `Dockerfile`), whatever the patterns say. A path outside the context (absolute,
    /// or leaving it with `..`) is not in the tar anyway and is ignored.
    pub fn keep(&mut self, path: &str) {
        let p = clean(path);
        if p == "." || p.starts_with('/') || p == ".." || p.starts_with("../") {
            return;
        }
        if !self.kept.contains(&p) {
            self.kept.push(p);
        }
    }

    /// Whether there are no patterns (nothing is excluded).
    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Whether `path` (slash-separated, relative to the context root, e.g.
    /// `node_modules/x/index.js`) is left out: the last pattern matching it or one of its
    /// parent directories is not an exception, and it is not a kept path.
    pub fn is_excluded(&self, path: &str) -> bool {
        if self.kept.iter().any(|k| k == path) {
            return false;
        }
        // patternmatcher.MatchesOrParentMatches.
        let parents: Vec<&str> = path.match_indices('/').map(|(i, _)| &path[..i]).collect();
        let mut excluded = false;
        for p in &self.patterns {
            // A pattern that could only confirm the current answer is skipped.
            if p.exception != excluded {
                continue;
            }
            if p.matches(path) || parents.iter().any(|d| p.matches(d)) {
                excluded = !p.exception;
            }
        }
        excluded
    }

    /// Whether some path strictly below directory `dir` may be sent although `dir`
    /// itself is excluded: a kept path lies below it, or an exception could match
    /// something below it. `false` means the walk can skip `dir`'s whole subtree. It
    /// errs towards `true` (a pattern with `**` anywhere is assumed to reach down).
    pub fn may_include_below(&self, dir: &str) -> bool {
        let prefix = format!("{dir}/");
        if self.kept.iter().any(|k| k.starts_with(&prefix)) {
            return true;
        }
        let dirs: Vec<&str> = dir.split('/').collect();
        self.patterns
            .iter()
            .filter(|p| p.exception)
            .any(|p| may_match_below(&p.text, &dirs))
    }
}

impl Pattern {
    fn matches(&self, path: &str) -> bool {
        match &self.matcher {
            Matcher::Exact => path == self.text,
            Matcher::Prefix(pre) => path.starts_with(pre.as_str()),
            Matcher::Suffix(suf) => {
                // `**/foo` also matches `foo` itself.
                path.ends_with(suf.as_str()) || suf.strip_prefix('/').is_some_and(|s| path == s)
            }
            Matcher::Regex(re) => re.is_match(path),
        }
    }
}

/// Whether pattern `pat` (cleaned) could match a path with more components than
/// `dirs` whose first components are `dirs`. Component by component: a component with
/// `**` (or one that does not compile on its own) could match anything from there on.
fn may_match_below(pat: &str, dirs: &[&str]) -> bool {
    let comps: Vec<&str> = pat.split('/').collect();
    if comps.len() <= dirs.len() && !pat.contains("**") {
        return false;
    }
    for (c, d) in comps.iter().zip(dirs) {
        if c.contains("**") {
            return true;
        }
        match compile(c) {
            Ok(Matcher::Exact) => {
                if c != d {
                    return false;
                }
            }
            Ok(Matcher::Regex(re)) => {
                if !re.is_match(d) {
                    return false;
                }
            }
            _ => return true,
        }
    }
    true
}

/// Go's `filepath.Clean` for `/`-separated paths: repeated `/` and `.` components go,
/// `x/..` pairs cancel, a rooted path drops leading `..`, and the empty result is `.`.
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut out: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => match out.last() {
                Some(&last) if last != ".." => {
                    out.pop();
                }
                _ if rooted => {}
                _ => out.push(".."),
            },
            c => out.push(c),
        }
    }
    let joined = out.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".to_string(),
        (false, false) => joined,
    }
}

/// `c` as a literal in a regex, inside or outside a class.
fn lit(c: char, out: &mut String) {
    if c.is_ascii_punctuation() && c != '<' && c != '>' {
        out.push('\\');
    }
    out.push(c);
}

/// One cleaned pattern (without `!`) to its matcher: moby's `Pattern.compile`, with
/// the syntax checks of Go's `filepath.Match` and every literal escaped. Errors are the
/// reason a pattern does not parse.
fn compile(pat: &str) -> Result<Matcher, String> {
    #[derive(PartialEq)]
    enum Ty {
        Exact,
        Prefix,
        Suffix,
        Regex,
    }
    let chars: Vec<char> = pat.chars().collect();
    let mut re = String::from("^");
    let mut ty = Ty::Exact;
    let mut i = 0;
    let mut first = true;
    while i < chars.len() {
        let ch = chars[i];
        i += 1;
        match ch {
            '*' if chars.get(i) == Some(&'*') => {
                i += 1;
                if chars.get(i) == Some(&'/') {
                    i += 1;
                }
                if i == chars.len() {
                    if ty == Ty::Exact {
                        ty = Ty::Prefix;
                    } else {
                        re.push_str(".*");
                        ty = Ty::Regex;
                    }
                } else {
                    re.push_str("(?:.*/)?");
                    ty = Ty::Regex;
                }
                if first {
                    ty = Ty::Suffix;
                }
            }
            '*' => {
                re.push_str("[^/]*");
                ty = Ty::Regex;
            }
            '?' => {
                re.push_str("[^/]");
                ty = Ty::Regex;
            }
            '\\' => {
                let Some(&c) = chars.get(i) else {
                    return Err("a \\ at the end escapes nothing".to_string());
                };
                i += 1;
                lit(c, &mut re);
                ty = Ty::Regex;
            }
            '[' => {
                i = class(&chars, i, &mut re)?;
                ty = Ty::Regex;
            }
            c => lit(c, &mut re),
        }
        first = false;
    }
    Ok(match ty {
        Ty::Exact => Matcher::Exact,
        Ty::Prefix => Matcher::Prefix(pat[..pat.len() - 2].to_string()),
        Ty::Suffix => Matcher::Suffix(pat[2..].to_string()),
        Ty::Regex => {
            re.push('$');
            Matcher::Regex(Regex::new(&re).map_err(|e| e.to_string())?)
        }
    })
}

/// A character class starting after its `[` at `chars[i]`, in Go's `filepath.Match`
/// syntax: `^` negates, then one or more `c` or `lo-hi` with `\` escaping, up to `]`.
/// Appends the regex class and returns the index after the `]`.
fn class(chars: &[char], mut i: usize, re: &mut String) -> Result<usize, String> {
    let unclosed = || "unclosed character class [".to_string();
    // Go's getEsc: one class character, escaped or not, never `-` or `]` unescaped.
    let one = |i: &mut usize| -> Result<char, String> {
        match chars.get(*i) {
            None => Err(unclosed()),
            Some('-') | Some(']') => Err(
                "a character class has a bare - or ] where a character belongs (escape it with \\)"
                    .to_string(),
            ),
            Some('\\') => {
                let c = *chars.get(*i + 1).ok_or_else(unclosed)?;
                *i += 2;
                Ok(c)
            }
            Some(&c) => {
                *i += 1;
                Ok(c)
            }
        }
    };
    let negated = chars.get(i) == Some(&'^');
    if negated {
        i += 1;
    }
    let mut ranges: Vec<(char, char)> = Vec::new();
    let mut n = 0;
    loop {
        if chars.get(i) == Some(&']') && n > 0 {
            i += 1;
            break;
        }
        let lo = one(&mut i)?;
        let mut hi = lo;
        match chars.get(i) {
            None => return Err(unclosed()),
            Some('-') => {
                i += 1;
                hi = one(&mut i)?;
                if i >= chars.len() {
                    return Err(unclosed());
                }
            }
            Some(_) => {}
        }
        // Go accepts a reversed range; it matches nothing.
        if lo <= hi {
            ranges.push((lo, hi));
        }
        n += 1;
    }
    match (ranges.is_empty(), negated) {
        // Nothing to match, or anything at all (a class can match `/`, as in Go).
        (true, false) => re.push_str(r"[^\x00-\x{10FFFF}]"),
        (true, true) => re.push_str("(?s:.)"),
        (false, _) => {
            re.push('[');
            if negated {
                re.push('^');
            }
            for (lo, hi) in ranges {
                lit(lo, re);
                if hi != lo {
                    re.push('-');
                    lit(hi, re);
                }
            }
            re.push(']');
        }
    }
    Ok(i)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ig(text: &str) -> DockerIgnore {
        DockerIgnore::parse(text).unwrap()
    }

    /// Which of `paths` `text` leaves out.
    fn out(text: &str, paths: &[&str]) -> Vec<String> {
        let ig = ig(text);
        paths
            .iter()
            .filter(|p| ig.is_excluded(p))
            .map(|p| p.to_string())
            .collect()
    }

    #[test]
    fn plain_names_exclude_the_path_and_everything_below() {
        let paths = [
            ".git",
            ".git/HEAD",
            ".git/refs/x",
            "a/.git",
            "git",
            "src/main.rs",
        ];
        assert_eq!(out(".git\n", &paths), [".git", ".git/HEAD", ".git/refs/x"]);
        // A trailing `/`, a leading `/` and `./` all mean the same root-relative path.
        for p in [".git/", "/.git", "./.git", ".git//", "x/../.git"] {
            assert_eq!(out(p, &paths), [".git", ".git/HEAD", ".git/refs/x"], "{p}");
        }
        assert!(out("", &paths).is_empty());
    }

    #[test]
    fn star_and_question_mark_stay_within_one_component() {
        let paths = ["a.log", "b.log", "sub/a.log", "ab.txt", "abc.txt", "a/b"];
        assert_eq!(out("*.log", &paths), ["a.log", "b.log"]);
        assert_eq!(out("*/*.log", &paths), ["sub/a.log"]);
        assert_eq!(out("a?.txt", &paths), ["ab.txt"]);
        assert_eq!(out("a?b", &paths), Vec::<String>::new());
        // A parent directory matched by `*` takes its contents along.
        assert_eq!(out("*", &["x", "x/y", "x/y/z"]), ["x", "x/y", "x/y/z"]);
    }

    #[test]
    fn double_star_matches_any_number_of_directories() {
        let paths = ["x.pyc", "a/x.pyc", "a/b/c/x.pyc", "a/x.py"];
        assert_eq!(out("**/*.pyc", &paths), ["x.pyc", "a/x.pyc", "a/b/c/x.pyc"]);
        assert_eq!(
            out("a/**/x.pyc", &paths),
            ["a/x.pyc", "a/b/c/x.pyc"],
            "zero directories too"
        );
        assert_eq!(out("a/**", &["a", "a/x", "a/b/c"]), ["a/x", "a/b/c"]);
        assert_eq!(
            out(
                "**/node_modules",
                &["node_modules/x", "web/node_modules/y", "node_modules_old"]
            ),
            ["node_modules/x", "web/node_modules/y"]
        );
        assert_eq!(out("**", &["a", "b/c"]), ["a", "b/c"]);
    }

    #[test]
    fn classes_and_escapes_follow_go() {
        let paths = ["a1", "a2", "a9", "ab", "a-", "a!", "a*", "a]"];
        assert_eq!(out("a[12]", &paths), ["a1", "a2"]);
        assert_eq!(out("a[0-9]", &paths), ["a1", "a2", "a9"]);
        assert_eq!(out("a[^0-9]", &paths), ["ab", "a-", "a!", "a*", "a]"]);
        // `!` is not a negation in Go's classes; `\` escapes inside and outside them.
        assert_eq!(out("a[!]", &paths), ["a!"]);
        assert_eq!(out("a[\\-\\]]", &paths), ["a-", "a]"]);
        assert_eq!(out("a\\*", &paths), ["a*"]);
        // Regex and brace characters are literal.
        assert_eq!(out("{a,b}.(x)+$", &["{a,b}.(x)+$", "a.x"]), ["{a,b}.(x)+$"]);
    }

    #[test]
    fn exceptions_and_the_last_match_wins() {
        let paths = ["a.md", "README.md", "docs/x.md", "docs", "docs/keep/y.md"];
        assert_eq!(out("*.md\n!README.md\n", &paths), ["a.md"]);
        assert_eq!(out("!README.md\n*.md\n", &paths), ["a.md", "README.md"]);
        // A later exception re-includes a path below an excluded directory; the
        // directory itself stays excluded.
        assert_eq!(
            out("docs\n!docs/keep\n", &paths),
            ["docs/x.md", "docs"],
            "docs/keep/y.md is back"
        );
        assert_eq!(
            out("docs\n!docs/keep\ndocs/keep/*.md\n", &paths),
            ["docs/x.md", "docs", "docs/keep/y.md"]
        );
        assert_eq!(out("*\n!docs\n", &paths), ["a.md", "README.md"]);
    }

    #[test]
    fn comments_blank_lines_and_spaces() {
        let text = "\u{feff}# a comment\n\n   \n  tmp  \r\n! keep.tmp\n #x\n";
        let paths = ["# a comment", "tmp", "tmp/a", "keep.tmp", "#x"];
        assert_eq!(out(text, &paths), ["tmp", "tmp/a", "#x"]);
        assert_eq!(ig(text).patterns.len(), 3);
    }

    #[test]
    fn the_dockerfile_and_the_ignore_file_are_always_kept() {
        let text = "*\n";
        let b = DockerIgnore::for_build(text, &["./build/app.Dockerfile"]).unwrap();
        assert!(b.is_excluded("src"));
        assert!(!b.is_excluded(".dockerignore"));
        assert!(!b.is_excluded("build/app.Dockerfile"));
        assert!(b.is_excluded("build"), "only the kept path itself");
        assert!(b.may_include_below("build"));
        assert!(!b.may_include_below("src"));
        let plain = ig(text);
        assert!(plain.is_excluded(".dockerignore") && plain.is_excluded("Dockerfile"));
        // A Dockerfile outside the context keeps nothing.
        let outside = DockerIgnore::for_build(text, &["../Dockerfile", "/Dockerfile"]).unwrap();
        assert_eq!(outside.kept, [".dockerignore"]);
    }

    #[test]
    fn subtrees_are_skipped_only_when_no_exception_reaches_into_them() {
        let i = ig("node_modules\n.git\n!node_modules/keep\n!*.md\n");
        assert!(i.may_include_below("node_modules"));
        assert!(
            !i.may_include_below(".git"),
            "*.md names top-level paths only"
        );
        let i = ig(".git\n!**/*.md\n");
        assert!(i.may_include_below(".git"));
        let i = ig("a\n!a/b/c\n");
        assert!(i.may_include_below("a") && i.may_include_below("a/b"));
        assert!(!i.may_include_below("a/x") && !i.may_include_below("a/b/c"));
        let i = ig("a\n!a\n");
        assert!(!i.may_include_below("b"));
    }

    #[test]
    fn a_bad_pattern_names_its_line() {
        let e = DockerIgnore::parse("ok\n# fine\n  [abc\n").unwrap_err();
        assert_eq!(
            e.to_string(),
            "line 3: pattern \"[abc\" does not parse: unclosed character class ["
        );
        assert_eq!((e.line, e.pattern.as_str()), (3, "[abc"));
        for (p, why) in [
            ("a\\", "escapes nothing"),
            ("[]", "bare - or ]"),
            ("[a-]", "bare - or ]"),
            ("x/[^]", "bare - or ]"),
            ("!", "needs a pattern"),
            ("!/", "needs a pattern"),
        ] {
            let e = DockerIgnore::parse(p).unwrap_err();
            assert!(e.reason.contains(why), "{p}: {e}");
            assert_eq!(e.line, 1);
        }
        // Go accepts a reversed range (it matches nothing).
        assert!(out("a[z-a]", &["a", "aa", "az"]).is_empty());
    }

    #[test]
    fn clean_is_gos() {
        for (i, o) in [
            ("", "."),
            ("a/b/", "a/b"),
            ("./a//b/./c", "a/b/c"),
            ("a/../../b", "../b"),
            ("/../a", "/a"),
            ("/", "/"),
            ("..", ".."),
        ] {
            assert_eq!(clean(i), o, "{i}");
        }
    }
}
