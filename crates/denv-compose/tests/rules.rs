//! One test per rule of `13-ref-compose.md` (and each decision documented in
//! `src/parse.rs`), asserting the exact message.

use denv_compose::{is_root_user, parse, Clock, Egress, Health, Resources, Spec, VolumeMount};

/// Parse and expect success.
fn ok(yaml: &str) -> Spec {
    match parse(yaml) {
        Ok(spec) => spec,
        Err(e) => panic!("expected the file to parse, got: {e}\n---\n{yaml}"),
    }
}

/// Parse and expect a refusal; returns the message.
fn err(yaml: &str) -> String {
    match parse(yaml) {
        Ok(spec) => panic!("expected a refusal, got {spec:?}\n---\n{yaml}"),
        Err(e) => e.to_string(),
    }
}

/// A one-service file with extra service keys (indented by 4 under `services.app`) and a
/// declared volume `data`.
fn svc(extra: &str) -> String {
    let mut s = String::from("services:\n  app:\n    image: alpine:3\n");
    for line in extra.lines() {
        s.push_str("    ");
        s.push_str(line);
        s.push('\n');
    }
    s.push_str("volumes:\n  data: {}\n");
    s
}

fn app(yaml: &str) -> denv_compose::Service {
    ok(yaml).services.remove(0)
}

// ----- document shape -------------------------------------------------------------------

#[test]
fn empty_file_has_no_services() {
    assert_eq!(err(""), "compose: no services");
    assert_eq!(err("# only a comment\n"), "compose: no services");
}

#[test]
fn missing_null_or_empty_services() {
    assert_eq!(err("volumes: {a: {}}\n"), "compose: no services");
    assert_eq!(err("services:\n"), "compose: no services");
    assert_eq!(err("services: {}\n"), "compose: no services");
}

#[test]
fn services_must_be_a_mapping() {
    assert_eq!(
        err("services: [a, b]\n"),
        "compose: services must be a mapping of service name to service, got a list"
    );
}

#[test]
fn document_must_be_a_mapping() {
    assert_eq!(
        err("- a\n- b\n"),
        "compose: the file must be a mapping with a services key, got a list"
    );
    assert_eq!(
        err("just a string"),
        "compose: the file must be a mapping with a services key, got a string"
    );
}

#[test]
fn invalid_yaml_reports_line_and_column() {
    assert_eq!(
        err("services:\n  app:\n    image: [alpine\n"),
        "compose: invalid YAML at line 4 column 1: did not find expected ',' or ']', while parsing a flow sequence at line 3 column 12"
    );
    assert_eq!(
        err("services:\n\tapp: {}\n"),
        "compose: invalid YAML at line 2 column 1: found character that cannot start any token, while scanning for the next token"
    );
}

#[test]
fn duplicate_key_is_invalid_yaml() {
    assert_eq!(
        err("services:\n  a: {image: x}\n  a: {image: y}\n"),
        "compose: invalid YAML at line 2 column 3: services: duplicate entry with key \"a\""
    );
}

#[test]
fn several_documents_are_invalid_yaml() {
    assert_eq!(
        err("services: {a: {image: x}}\n---\nservices: {}\n"),
        "compose: invalid YAML: deserializing from YAML containing more than one document is not supported"
    );
}

#[test]
fn unknown_top_level_keys_are_ignored() {
    let spec = ok("version: \"3.9\"\nname: shop\nnetworks: {front: {}}\nx-other: 1\nservices:\n  a: {image: x}\n");
    assert_eq!(spec.services.len(), 1);
    assert_eq!(spec.services[0].image, "x");
}

#[test]
fn merge_keys_and_anchors_are_applied() {
    let spec = ok("x-base: &base\n  image: python:3.12-slim\n  user: \"1000:1000\"\n  environment: {A: \"1\"}\nservices:\n  a:\n    <<: *base\n    command: [sleep, infinity]\n  b:\n    <<: *base\n    image: redis:7\n");
    assert_eq!(spec.services[0].image, "python:3.12-slim");
    assert_eq!(spec.services[0].user, "1000:1000");
    assert_eq!(spec.services[0].command, ["sleep", "infinity"]);
    assert_eq!(
        spec.services[1].image, "redis:7",
        "own keys win over merged ones"
    );
    assert_eq!(spec.services[1].env.get("A").map(String::as_str), Some("1"));
}

#[test]
fn tags_are_stripped() {
    let spec = ok("services:\n  a:\n    image: !override alpine:3\n    ports: !reset [80]\n");
    assert_eq!(spec.services[0].image, "alpine:3");
    assert_eq!(spec.services[0].ports, [80]);
}

#[test]
fn deep_nesting_is_refused_quickly() {
    let started = std::time::Instant::now();
    assert_eq!(
        err(&format!("services: {}", "[".repeat(1_000_000))),
        "compose: invalid YAML at line 1 column 75: collections nested deeper than 64 levels"
    );
    assert_eq!(
        err(&format!("services:\n  a: {}", "{a: ".repeat(100_000))),
        "compose: invalid YAML at line 2 column 262: collections nested deeper than 64 levels"
    );
    // Within the flow limit, block nesting still hits serde_yaml's recursion limit.
    let mut block = String::from("services:\n");
    for i in 0..200 {
        block.push_str(&" ".repeat(i + 1));
        block.push_str("- \n");
    }
    assert!(
        err(&block).starts_with("compose: invalid YAML"),
        "{}",
        err(&block)
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn long_depends_on_chains_and_lists_stay_fast() {
    let n = 20_000;
    let mut y = String::from("services:\n");
    for i in 0..n {
        y.push_str(&format!(
            "  s{i:05}: {{image: x, depends_on: [s{:05}]}}\n",
            (i + 1) % n
        ));
    }
    let started = std::time::Instant::now();
    let e = err(&y);
    assert!(
        e.starts_with("compose: depends_on cycle: s00000 -> s00001 -> "),
        "{}",
        &e[..80]
    );
    assert!(e.ends_with(" -> s19999 -> s00000"));
    let ports: Vec<String> = (0..50_000).map(|i| (1 + i % 60_000).to_string()).collect();
    let y = format!(
        "services:\n  a: {{image: x, ports: [{}]}}\n",
        ports.join(", ")
    );
    assert_eq!(ok(&y).services[0].ports.len(), 50_000);
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn sixty_four_levels_are_still_parsed() {
    let y = format!(
        "services: {{a: {{image: x}}}}\nx-deep: {}{}\n",
        "[".repeat(62),
        "]".repeat(62)
    );
    assert_eq!(ok(&y).services[0].image, "x");
}

#[test]
fn a_large_file_parses_in_linear_time() {
    let mut y = String::from("services:\n");
    for i in 0..5000 {
        y.push_str(&format!(
            "  s{i:05}: {{image: x, environment: {{A: \"1\"}}, ports: [\"80\"]}}\n"
        ));
    }
    let started = std::time::Instant::now();
    assert_eq!(ok(&y).services.len(), 5000);
    assert!(started.elapsed() < std::time::Duration::from_secs(30));
}

#[test]
fn alias_bomb_is_an_error_not_a_hang() {
    let mut y = String::from("a0: &a0 [x, x, x, x, x, x, x, x, x, x]\n");
    for i in 1..12 {
        let p = i - 1;
        y.push_str(&format!(
            "a{i}: &a{i} [*a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}, *a{p}]\n"
        ));
    }
    y.push_str("services: {a: {image: x}}\n");
    assert_eq!(err(&y), "compose: invalid YAML: repetition limit exceeded");
}

// ----- services -------------------------------------------------------------------------

#[test]
fn services_are_sorted_by_name() {
    let spec = ok("services:\n  zeta: {image: z}\n  alpha: {image: a}\n  mid: {image: m}\n");
    let names: Vec<_> = spec.services.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(names, ["alpha", "mid", "zeta"]);
    assert_eq!(spec.first_service().map(|s| s.name.as_str()), Some("alpha"));
}

#[test]
fn service_names_are_checked() {
    assert_eq!(
        err("services:\n  ../etc: {image: x}\n"),
        "compose: service name \"../etc\" is invalid; use letters, digits, '.', '_' and '-', starting with a letter or digit"
    );
    assert_eq!(
        err("services:\n  [a]: {image: x}\n"),
        "compose: service names must be strings, got a list"
    );
}

#[test]
fn numeric_and_string_names_that_collide_are_refused() {
    assert_eq!(
        err("services:\n  1: {image: x}\n  \"1\": {image: y}\n"),
        "compose: service \"1\" is declared twice"
    );
}

#[test]
fn service_must_be_a_mapping() {
    assert_eq!(
        err("services:\n  a: alpine\n"),
        "compose: service \"a\" must be a mapping, got a string"
    );
}

#[test]
fn service_without_image_or_build() {
    let msg = "compose: service \"x\" has no image and no build";
    assert_eq!(err("services:\n  x: {}\n"), msg);
    assert_eq!(err("services:\n  x:\n"), msg);
    assert_eq!(err("services:\n  x: {image: \"\"}\n"), msg);
}

fn build_of(yaml: &str) -> (denv_compose::Service, denv_compose::Build) {
    let mut spec = ok(yaml);
    let b = spec.builds.remove("x").expect("a build for x");
    assert!(spec.builds.is_empty(), "only x builds: {:?}", spec.builds);
    (spec.services.remove(0), b)
}

#[test]
fn build_string_form_is_the_context() {
    let (s, b) = build_of("services:\n  x: {build: ./app}\n");
    assert_eq!(s.image, "", "the control plane sets the built tag");
    assert_eq!(b.context, "./app");
    assert_eq!(b.dockerfile, "Dockerfile");
    assert!(b.args.is_empty());
    assert_eq!(b.target, "");
    assert_eq!(b.context_digest, "");
}

#[test]
fn build_mapping_form_carries_context_dockerfile_args_target() {
    let y = "services:\n  x:\n    build:\n      context: ${CONTEXT_DIR}\n      dockerfile: ./docker/Dockerfile.dev\n      args: {VERSION: 3, DEBUG: true, FROM_SHELL: null}\n      target: runtime\n      cache_from: [x]\n      labels: {a: b}\n      pull: true\n";
    let (_, b) = build_of(y);
    assert_eq!(
        b.context, "${CONTEXT_DIR}",
        "variables are not interpolated"
    );
    assert_eq!(b.dockerfile, "docker/Dockerfile.dev");
    assert_eq!(
        b.args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        ["DEBUG=true", "VERSION=3"],
        "a key without a value is unset"
    );
    assert_eq!(b.target, "runtime");
    let (_, b) = build_of("services:\n  x: {build: {args: [\"A=1\", \"B\", \"C=x=y\"]}}\n");
    assert_eq!(b.context, ".", "context defaults to .");
    assert_eq!(
        b.args
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>(),
        ["A=1", "C=x=y"]
    );
}

#[test]
fn build_with_an_image_keeps_both() {
    let mut spec = ok(&svc("build: ."));
    assert_eq!(spec.services[0].image, "alpine:3");
    assert_eq!(
        spec.builds.remove("app").map(|b| b.context),
        Some(".".into())
    );
}

#[test]
fn build_refusals_name_the_problem() {
    let cases = [
        ("{build: [a]}", "compose: service \"x\" build must be a context path or a mapping, got a list"),
        ("{build: {context: \"https://github.com/a/b.git\"}}", "compose: service \"x\" build context \"https://github.com/a/b.git\" is a remote URL; only a local directory is uploaded"),
        ("{build: {dockerfile: /etc/passwd}}", "compose: service \"x\" build dockerfile \"/etc/passwd\" must be a relative path inside the context"),
        ("{build: {dockerfile: ../Dockerfile}}", "compose: service \"x\" build dockerfile \"../Dockerfile\" must be a relative path inside the context"),
        ("{build: {dockerfile: a/../../b}}", "compose: service \"x\" build dockerfile \"a/../../b\" must be a relative path inside the context"),
        ("{build: {dockerfile_inline: \"FROM x\"}}", "compose: service \"x\" uses build.dockerfile_inline, which is refused; put the Dockerfile in the context"),
        ("{build: {additional_contexts: {a: ../a}}}", "compose: service \"x\" uses build.additional_contexts, which is refused; only the one context is uploaded; put everything in it"),
        ("{build: {ssh: [default]}}", "compose: service \"x\" uses build.ssh, which is refused; the host's SSH agent is not lent to builds"),
        ("{build: {secrets: [s]}}", "compose: service \"x\" uses build.secrets, which is refused; they are read from host files"),
        ("{build: {entitlements: [network.host]}}", "compose: service \"x\" uses build.entitlements, which is refused; it widens the build's sandbox"),
        ("{build: {privileged: true}}", "compose: service \"x\" uses build.privileged, which is refused; it widens the build's sandbox"),
        ("{build: {network: host}}", "compose: service \"x\" uses build.network: host, which is refused; a build step would reach the host's network"),
        ("{build: {args: \"A=1\"}}", "compose: service \"x\" build args must be a mapping or a list of KEY=VALUE, got a string"),
        ("{build: {args: [\"=1\"]}}", "compose: service \"x\" build arg name \"\" is invalid"),
    ];
    for (svc, msg) in cases {
        assert_eq!(err(&format!("services:\n  x: {svc}\n")), msg, "{svc}");
    }
}

#[test]
fn build_key_changes_with_every_input_and_only_then() {
    let base = denv_compose::Build {
        context: ".".into(),
        dockerfile: "Dockerfile".into(),
        context_digest: "sha256:aa".into(),
        ..Default::default()
    };
    let k = base.key();
    assert_eq!(k.len(), 64);
    assert_eq!(base.tag(), format!("denv-build/{k}"));
    let mut same = base.clone();
    same.context = "./elsewhere".into();
    assert_eq!(
        same.key(),
        k,
        "where the context came from is not part of the key"
    );
    let variants = [
        denv_compose::Build {
            context_digest: "sha256:ab".into(),
            ..base.clone()
        },
        denv_compose::Build {
            dockerfile: "Dockerfile.dev".into(),
            ..base.clone()
        },
        denv_compose::Build {
            target: "t".into(),
            ..base.clone()
        },
        denv_compose::Build {
            scope: "team_b".into(),
            ..base.clone()
        },
        denv_compose::Build {
            args: [("A".to_string(), "1".to_string())].into(),
            ..base.clone()
        },
        // length-prefixed: moving a byte between fields changes the key
        denv_compose::Build {
            dockerfile: "Dockerfil".into(),
            target: "e".into(),
            ..base.clone()
        },
    ];
    for v in variants {
        assert_ne!(v.key(), k, "{v:?}");
    }
}

#[test]
fn image_with_whitespace_is_refused() {
    assert_eq!(
        err("services:\n  a: {image: \"alpine 3\"}\n"),
        "compose: service \"a\" image \"alpine 3\" is not a valid image reference"
    );
}

#[test]
fn network_mode_host() {
    assert_eq!(
        err(&svc("network_mode: host")),
        "compose: service \"app\" uses network_mode: host, which cannot be forked"
    );
}

#[test]
fn network_mode_other_than_bridge_is_refused() {
    for mode in ["none", "service:db", "container:abc"] {
        assert_eq!(
            err(&svc(&format!("network_mode: \"{mode}\""))),
            format!("compose: service \"app\" uses network_mode: {mode}, which is refused; every service joins the stack's own network")
        );
    }
    app(&svc("network_mode: bridge"));
    app(&svc("network_mode: default"));
}

#[test]
fn privileged_or_cap_add() {
    let msg = "compose: service \"app\" asks for privileged, which is refused";
    assert_eq!(err(&svc("privileged: true")), msg);
    assert_eq!(err(&svc("privileged: \"true\"")), msg);
    let allowed = "AUDIT_WRITE, CHOWN, DAC_OVERRIDE, FOWNER, FSETID, KILL, MKNOD, NET_BIND_SERVICE, NET_RAW, SETFCAP, SETGID, SETPCAP, SETUID, SYS_CHROOT";
    for cap in [
        "NET_ADMIN",
        "ALL",
        "SYS_ADMIN",
        "SYS_PTRACE",
        "cap_sys_module",
        "SYS_RAWIO",
        "SYS_BOOT",
        "DAC_READ_SEARCH",
        "MAC_ADMIN",
        "BPF",
        "PERFMON",
        "SYS_RESOURCE",
    ] {
        assert_eq!(
            err(&svc(&format!("cap_add: [CHOWN, {cap}]\nprivileged: false"))),
            format!("compose: service \"app\" cap_add {cap} is refused; only capabilities of Docker's default set can be added back ({allowed})")
        );
    }
    assert_eq!(
        err(&svc("cap_add: {a: b}")),
        "compose: service \"app\" cap_add must be a list of capability names, got a mapping"
    );
    app(&svc("privileged: false"));
    app(&svc("cap_add: []"));
    let s = parse(&svc("cap_add: [cap_setuid, SETGID, CHOWN, CHOWN]")).unwrap();
    assert_eq!(s.services[0].cap_add, ["CHOWN", "SETGID", "SETUID"]);
    let s = parse(&svc("cap_add: NET_BIND_SERVICE")).unwrap();
    assert_eq!(s.services[0].cap_add, ["NET_BIND_SERVICE"]);
}

#[test]
fn agent_never_adds_capabilities() {
    let f = "services:\n  box: {image: x, user: \"1000:1000\", cap_add: [CHOWN]}\nx-denv:\n  agent: {service: box}\n";
    assert_eq!(
        err(f),
        "compose: x-denv.agent.service \"box\" uses cap_add, which is refused; the agent runs with no capabilities"
    );
}

#[test]
fn disk_quota() {
    let f = |d: &str| format!("services:\n  a: {{image: x}}\nx-denv:\n  disk: {d}\n");
    assert_eq!(parse(&f("20g")).unwrap().disk_mb, 20 * 1024);
    assert_eq!(parse(&f("64m")).unwrap().disk_mb, 64);
    assert_eq!(parse(&f("0")).unwrap().disk_mb, 0);
    assert_eq!(parse("services:\n  a: {image: x}\n").unwrap().disk_mb, 0);
    assert_eq!(
        err(&f("1m")),
        "compose: x-denv.disk \"1m\" must be a size like 512m or 20g (at least 16m)"
    );
    assert_eq!(
        err(&f("lots")),
        "compose: x-denv.disk \"lots\" must be a size like 512m or 20g (at least 16m)"
    );
}

#[test]
fn warm_pool_size() {
    let f = |d: &str| format!("services:\n  a: {{image: x}}\nx-denv:\n  pool: {d}\n");
    assert_eq!(parse(&f("4")).unwrap().pool, 4);
    assert_eq!(parse(&f("0")).unwrap().pool, 0);
    assert_eq!(parse(&f("64")).unwrap().pool, 64);
    assert_eq!(parse("services:\n  a: {image: x}\n").unwrap().pool, 0);
    for bad in ["65", "-1", "1.5", "lots", "\"3\"", "[1]"] {
        let want = format!(
            "compose: x-denv.pool \"{}\" must be a whole number from 0 to 64 (warm forks kept)",
            match bad {
                "\"3\"" => "3",
                "[1]" => "a list",
                b => b,
            }
        );
        assert_eq!(err(&f(bad)), want, "{bad}");
    }
    // The spec carries it, and a spec without one reads back as 0.
    let s = parse(&f("2")).unwrap();
    let back: denv_compose::Spec =
        serde_json::from_value(serde_json::to_value(&s).unwrap()).unwrap();
    assert_eq!(back.pool, 2);
}

macro_rules! refuses {
    ($($test:ident: $extra:expr => $msg:expr;)*) => {$(
        #[test]
        fn $test() {
            assert_eq!(err(&svc($extra)), $msg);
        }
    )*};
}

refuses! {
    refuses_devices: "devices: [\"/dev/kvm:/dev/kvm\"]" =>
        "compose: service \"app\" uses devices, which is refused; host devices reach outside the sandbox";
    refuses_device_cgroup_rules: "device_cgroup_rules: [\"c 1:3 mr\"]" =>
        "compose: service \"app\" uses device_cgroup_rules, which is refused; host devices reach outside the sandbox";
    refuses_gpus: "gpus: all" =>
        "compose: service \"app\" uses gpus, which is refused; GPU passthrough is not available yet";
    refuses_gpu_reservations: "deploy:\n  resources:\n    reservations:\n      devices: [{capabilities: [gpu]}]" =>
        "compose: service \"app\" uses deploy.resources.reservations.devices, which is refused; GPU passthrough is not available yet";
    refuses_security_opt: "security_opt: [\"seccomp:unconfined\"]" =>
        "compose: service \"app\" uses security_opt, which is refused; it can switch off the sandbox's confinement";
    refuses_sysctls: "sysctls: {net.ipv4.ip_forward: 1}" =>
        "compose: service \"app\" uses sysctls, which is refused; kernel parameters are not set for environments";
    refuses_volumes_from: "volumes_from: [db]" =>
        "compose: service \"app\" uses volumes_from, which is refused; it shares another container's mounts; use named volumes";
    refuses_pid_host: "pid: host" =>
        "compose: service \"app\" uses pid: host, which is refused; a shared pid namespace reaches outside the service";
    refuses_pid_service: "pid: \"service:db\"" =>
        "compose: service \"app\" uses pid: service:db, which is refused; a shared pid namespace reaches outside the service";
    refuses_ipc_host: "ipc: host" =>
        "compose: service \"app\" uses ipc: host, which is refused; a shared ipc namespace reaches outside the service";
    refuses_ipc_container: "ipc: \"container:abc\"" =>
        "compose: service \"app\" uses ipc: container:abc, which is refused; a shared ipc namespace reaches outside the service";
    refuses_uts_host: "uts: host" =>
        "compose: service \"app\" uses uts: host, which is refused; host namespaces reach outside the sandbox";
    refuses_userns_host: "userns_mode: host" =>
        "compose: service \"app\" uses userns_mode: host, which is refused; host namespaces reach outside the sandbox";
    refuses_cgroup_host: "cgroup: host" =>
        "compose: service \"app\" uses cgroup: host, which is refused; host namespaces reach outside the sandbox";
    refuses_cgroup_parent: "cgroup_parent: /system.slice" =>
        "compose: service \"app\" uses cgroup_parent, which is refused; the sidecar places every service in its own capped cgroup";
    refuses_oom_kill_disable: "oom_kill_disable: true" =>
        "compose: service \"app\" uses oom_kill_disable, which is refused; it would defeat the memory cap";
    refuses_env_file: "env_file: .env" =>
        "compose: service \"app\" uses env_file, which is refused; the file is not read; put the variables under environment";
    refuses_secrets: "secrets: [token]" =>
        "compose: service \"app\" uses secrets, which is refused; they are read from host files; use environment or a named volume";
    refuses_configs: "configs: [nginx]" =>
        "compose: service \"app\" uses configs, which is refused; they are read from host files; use environment or a named volume";
    refuses_entrypoint: "entrypoint: [/bin/sh, -c]" =>
        "compose: service \"app\" uses entrypoint, which is refused; it is not carried in v0; put the whole argv in command";
    refuses_working_dir: "working_dir: /app" =>
        "compose: service \"app\" uses working_dir, which is refused; it is not carried in v0; use command: [\"sh\", \"-c\", \"cd /dir && ...\"]";
}

#[test]
fn harmless_namespace_values_are_accepted() {
    app(&svc("ipc: private"));
    app(&svc("ipc: shareable"));
    app(&svc("uts: \"\""));
    app(&svc("oom_kill_disable: false"));
    app(&svc("devices: []"));
}

#[test]
fn ignored_keys_do_not_change_the_service() {
    let plain = app(&svc(""));
    let extra = "container_name: fixed\nhostname: h\nrestart: always\nlabels: {a: b}\nlogging: {driver: none}\nstdin_open: true\ntty: true\ninit: true\nshm_size: 1g\nstop_signal: SIGINT\nstop_grace_period: 5s\nexpose: [\"9000\"]\nnetworks: [default, front]\nplatform: linux/amd64\npull_policy: always\nprofiles: [x]\nread_only: true\ntmpfs: [/tmp]\nulimits: {nofile: 1024}\ncap_drop: [ALL]\ndns: [1.1.1.1]\nextra_hosts: [\"a:1.2.3.4\"]\nlinks: [db]\nmac_address: 02:42:ac:11:65:43\noom_score_adj: 100\nmem_reservation: 1g\ncpu_shares: 512\nruntime: runc\nscale: 3\ndeploy: {replicas: 2}\nx-note: hi";
    assert_eq!(app(&svc(extra)), plain);
}

// ----- environment ----------------------------------------------------------------------

#[test]
fn environment_map_stringifies_scalars() {
    let s = app(&svc("environment:\n  A: text\n  PORT: 5432\n  DEBUG: true\n  RATIO: 0.5\n  EMPTY: \"\"\n  FROM_SHELL:"));
    let env: Vec<_> = s
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(
        env,
        [
            ("A", "text"),
            ("DEBUG", "true"),
            ("EMPTY", ""),
            ("PORT", "5432"),
            ("RATIO", "0.5")
        ]
    );
}

#[test]
fn environment_list_of_key_value() {
    let s = app(&svc(
        "environment:\n  - A=1\n  - B=x=y\n  - C=\n  - FROM_SHELL",
    ));
    let env: Vec<_> = s
        .env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    assert_eq!(env, [("A", "1"), ("B", "x=y"), ("C", "")]);
}

#[test]
fn environment_errors() {
    assert_eq!(
        err(&svc("environment: {A: [1, 2]}")),
        "compose: service \"app\" environment variable \"A\" must be a string, number or bool"
    );
    assert_eq!(
        err(&svc("environment: [5]")),
        "compose: service \"app\" environment entry \"5\" must be KEY=VALUE"
    );
    assert_eq!(
        err(&svc("environment: [\"=x\"]")),
        "compose: service \"app\" environment variable name \"\" is invalid"
    );
    assert_eq!(
        err(&svc("environment: A=1")),
        "compose: service \"app\" environment must be a mapping or a list of KEY=VALUE, got a string"
    );
}

// ----- ports ----------------------------------------------------------------------------

#[test]
fn ports_keep_the_container_port_only() {
    let s = app(&svc("ports:\n  - \"8080:80\"\n  - \"443/tcp\"\n  - \"127.0.0.1:5433:5432\"\n  - 9000\n  - \"[::1]:6380:6379/tcp\"\n  - {target: 3000, published: 13000, protocol: tcp}\n  - \"8081:80\""));
    assert_eq!(s.ports, [80, 443, 5432, 9000, 6379, 3000]);
}

#[test]
fn udp_ports_are_refused() {
    assert_eq!(
        err(&svc("ports: [\"53:53/udp\"]")),
        "compose: service \"app\" port \"53:53/udp\" is refused; only tcp ports are supported"
    );
    assert_eq!(
        err(&svc("ports: [{target: 53, protocol: udp}]")),
        "compose: service \"app\" port \"53/udp\" is refused; only tcp ports are supported"
    );
}

#[test]
fn invalid_ports_are_refused() {
    for (written, shown) in [
        ("\"8000-8010:8000-8010\"", "8000-8010:8000-8010"),
        ("0", "0"),
        ("70000", "70000"),
        ("\"http\"", "http"),
        ("\"80/quic\"", "80/quic"),
        ("[80]", "a list"),
    ] {
        assert_eq!(
            err(&svc(&format!("ports: [{written}]"))),
            format!("compose: service \"app\" port \"{shown}\" must be a container port (80, 8080:80 or 127.0.0.1:8080:80)")
        );
    }
}

// ----- volumes --------------------------------------------------------------------------

#[test]
fn named_volumes_short_and_long_form() {
    let y = "services:\n  app:\n    image: x\n    volumes:\n      - data:/var/data\n      - cfg:/etc/app:ro\n      - {type: volume, source: logs, target: /logs, read_only: true}\n      - {source: more, target: /more}\n      - {type: tmpfs, target: /tmp}\nvolumes: {data: {}, cfg: {}, logs: {}, more: null}\n";
    let spec = ok(y);
    assert_eq!(spec.volumes, ["cfg", "data", "logs", "more"]);
    let vm = |n: &str, p: &str, ro| VolumeMount {
        name: n.into(),
        path: p.into(),
        read_only: ro,
    };
    assert_eq!(
        spec.services[0].volumes,
        [
            vm("data", "/var/data", false),
            vm("cfg", "/etc/app", true),
            vm("logs", "/logs", true),
            vm("more", "/more", false)
        ]
    );
}

#[test]
fn volume_options() {
    let s = app(&svc("volumes: [\"data:/d:rw,nocopy\"]"));
    assert!(!s.volumes[0].read_only);
    let s = app(&svc("volumes: [\"data:/d:z,ro\"]"));
    assert!(s.volumes[0].read_only);
}

#[test]
fn bind_mounts_are_refused() {
    for (entry, source) in [
        ("/srv/data:/data", "/srv/data"),
        ("./data:/data", "./data"),
        ("../data:/data:ro", "../data"),
        ("~/data:/data", "~/data"),
        ("${PWD}/data:/data", "${PWD}/data"),
        (
            "/var/run/docker.sock:/var/run/docker.sock",
            "/var/run/docker.sock",
        ),
    ] {
        assert_eq!(
            err(&svc(&format!("volumes: [\"{entry}\"]"))),
            format!("compose: service \"app\" bind-mounts \"{source}\"; only named volumes are forkable")
        );
    }
    assert_eq!(
        err(&svc(
            "volumes: [{type: bind, source: /etc, target: /host-etc}]"
        )),
        "compose: service \"app\" bind-mounts \"/etc\"; only named volumes are forkable"
    );
    assert_eq!(
        err(&svc("volumes: [{type: volume, source: ./x, target: /x}]")),
        "compose: service \"app\" bind-mounts \"./x\"; only named volumes are forkable"
    );
}

#[test]
fn undeclared_volume() {
    assert_eq!(
        err(&svc("volumes: [\"other:/data\"]")),
        "compose: service \"app\" uses undeclared volume \"other\""
    );
    assert_eq!(
        err("services:\n  app: {image: x, volumes: [\"data:/d\"]}\n"),
        "compose: service \"app\" uses undeclared volume \"data\""
    );
}

#[test]
fn volume_without_a_container_path() {
    for (entry, shown) in [
        ("\"data\"", "data"),
        ("\"/data\"", "/data"),
        ("\"data:\"", "data:"),
        ("\"data:relative\"", "data:relative"),
        ("\":/d\"", ":/d"),
        ("\"data:/d:bogus\"", "data:/d:bogus"),
        ("\"data:/d:ro:extra\"", "data:/d:ro:extra"),
        ("{source: data}", "data"),
        ("{target: /anon}", "/anon"),
        ("5", "5"),
    ] {
        assert_eq!(
            err(&svc(&format!("volumes: [{entry}]"))),
            format!("compose: service \"app\" volume \"{shown}\" must be <name>:<path>")
        );
    }
}

#[test]
fn other_volume_types_are_refused() {
    assert_eq!(
        err(&svc("volumes: [{type: npipe, source: p, target: /p}]")),
        "compose: service \"app\" volume \"p\" has type \"npipe\", which is refused; only named volumes are forkable"
    );
}

#[test]
fn two_mounts_at_one_path() {
    assert_eq!(
        err("services:\n  app: {image: x, volumes: [\"a:/d\", \"b:/d\"]}\nvolumes: {a: {}, b: {}}\n"),
        "compose: service \"app\" mounts two volumes at \"/d\""
    );
}

#[test]
fn top_level_volume_rules() {
    assert_eq!(
        ok("services: {a: {image: x}}\nvolumes: {zz: {}, aa: {driver: local}, mm: null}\n").volumes,
        ["aa", "mm", "zz"]
    );
    assert_eq!(
        err("services: {a: {image: x}}\nvolumes: {ext: {external: true}}\n"),
        "compose: volume \"ext\" is external, which is refused; denv creates and forks every volume itself"
    );
    assert_eq!(
        err("services: {a: {image: x}}\nvolumes: [a, b]\n"),
        "compose: volumes must be a mapping of volume name to options, got a list"
    );
    assert_eq!(
        err("services: {a: {image: x}}\nvolumes: {\"..\": {}}\n"),
        "compose: volume name \"..\" is invalid; use letters, digits, '.', '_' and '-', starting with a letter or digit"
    );
    assert_eq!(
        err("services: {a: {image: x}}\nvolumes: {v: yes}\n"),
        "compose: volume \"v\" must be a mapping of options, got a string"
    );
}

#[test]
fn no_declared_volumes_is_fine() {
    let spec = ok("services: {a: {image: x}}\n");
    assert!(spec.volumes.is_empty());
}

// ----- depends_on -----------------------------------------------------------------------

#[test]
fn depends_on_list_or_map_keys() {
    let spec = ok("services:\n  a: {image: x, depends_on: [c, b, c]}\n  b: {image: x, depends_on: {c: {condition: service_healthy}}}\n  c: {image: x}\n");
    assert_eq!(spec.services[0].depends_on, ["c", "b"]);
    assert_eq!(spec.services[1].depends_on, ["c"]);
    assert!(spec.services[2].depends_on.is_empty());
    // The list form means service_started: nothing kept.
    assert!(spec.services[0].depends_on_condition.is_empty());
    assert_eq!(
        spec.services[1].depends_on_condition,
        [("c".to_string(), "service_healthy".to_string())].into()
    );
}

#[test]
fn depends_on_conditions_are_kept_and_unknown_ones_refused() {
    let spec = ok("services:
  a: {image: x, depends_on: {m: {condition: service_completed_successfully}, b: {condition: service_started}, c: {restart: true}, d: null}}
  b: {image: x}
  c: {image: x}
  d: {image: x}
  m: {image: x}
");
    assert_eq!(spec.services[0].depends_on, ["m", "b", "c", "d"]);
    assert_eq!(
        spec.services[0].depends_on_condition,
        [(
            "m".to_string(),
            "service_completed_successfully".to_string()
        )]
        .into()
    );
    assert_eq!(
        err("services:
  a: {image: x, depends_on: {b: {condition: service_ready}}}
  b: {image: x}
"),
        "compose: service \"a\" depends_on \"b\" condition \"service_ready\" must be service_started, service_healthy or service_completed_successfully"
    );
}

#[test]
fn depends_on_undeclared_service() {
    assert_eq!(
        err("services:\n  a: {image: x, depends_on: [db]}\n"),
        "compose: service \"a\" depends on \"db\", which is not a service in this file"
    );
    assert_eq!(
        err("services:\n  a: {image: x, depends_on: db}\n"),
        "compose: service \"a\" depends_on must be a list or a mapping of service names"
    );
}

#[test]
fn depends_on_cycles_are_refused() {
    assert_eq!(
        err("services:\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [c]}\n  c: {image: x, depends_on: [a]}\n"),
        "compose: depends_on cycle: a -> b -> c -> a"
    );
    assert_eq!(
        err("services:\n  a: {image: x, depends_on: [a]}\n"),
        "compose: depends_on cycle: a -> a"
    );
    // `a` leads to the cycle b <-> c; the cycle itself is named.
    assert_eq!(
        err("services:\n  a: {image: x, depends_on: [b]}\n  b: {image: x, depends_on: [c]}\n  c: {image: x, depends_on: [b]}\n"),
        "compose: depends_on cycle: b -> c -> b"
    );
    // A diamond is not a cycle.
    ok("services:\n  a: {image: x, depends_on: [b, c]}\n  b: {image: x, depends_on: [d]}\n  c: {image: x, depends_on: [d]}\n  d: {image: x}\n");
}

// ----- command --------------------------------------------------------------------------

#[test]
fn command_string_is_split_on_whitespace() {
    assert_eq!(
        app(&svc("command: \"redis-server  --appendonly\tyes\"")).command,
        ["redis-server", "--appendonly", "yes"]
    );
}

#[test]
fn command_list_is_kept_and_stringified() {
    assert_eq!(
        app(&svc("command: [\"sh\", \"-c\", \"echo a b\", 10]")).command,
        ["sh", "-c", "echo a b", "10"]
    );
    assert!(app(&svc("")).command.is_empty());
}

#[test]
fn command_of_another_shape_is_refused() {
    assert_eq!(
        err(&svc("command: {a: b}")),
        "compose: service \"app\" command must be a string or a list of strings"
    );
}

// ----- healthcheck ----------------------------------------------------------------------

fn health(extra: &str) -> Option<Health> {
    app(&svc(extra)).health
}

#[test]
fn healthcheck_list_forms() {
    assert_eq!(
        health("healthcheck: {test: [CMD, redis-cli, ping], interval: 2s, retries: 15}"),
        Some(Health {
            test: vec!["CMD".into(), "redis-cli".into(), "ping".into()],
            interval_ms: 2000,
            retries: 15
        })
    );
    assert_eq!(
        health("healthcheck: {test: [CMD-SHELL, pg_isready -U postgres]}"),
        Some(Health {
            test: vec!["CMD-SHELL".into(), "pg_isready -U postgres".into()],
            interval_ms: 30000,
            retries: 3
        })
    );
    assert_eq!(
        health("healthcheck: {test: [CMD-SHELL, pg_isready, -U, postgres]}").map(|h| h.test),
        Some(vec!["CMD-SHELL".into(), "pg_isready -U postgres".into()])
    );
}

#[test]
fn healthcheck_string_becomes_cmd_shell() {
    assert_eq!(
        health("healthcheck: {test: \"curl -f http://localhost/ || exit 1\"}").map(|h| h.test),
        Some(vec![
            "CMD-SHELL".into(),
            "curl -f http://localhost/ || exit 1".into()
        ])
    );
}

#[test]
fn healthcheck_none_or_disabled() {
    assert_eq!(health("healthcheck: {test: [NONE]}"), None);
    assert_eq!(health("healthcheck: {test: NONE}"), None);
    assert_eq!(
        health("healthcheck: {test: [CMD, true], disable: true}"),
        None
    );
    assert_eq!(health("healthcheck: {interval: 5s}"), None);
    assert_eq!(health(""), None);
}

#[test]
fn healthcheck_intervals() {
    let iv = |s: &str| {
        health(&format!("healthcheck: {{test: [CMD, x], interval: {s}}}")).map(|h| h.interval_ms)
    };
    assert_eq!(iv("2s"), Some(2000));
    assert_eq!(iv("1m30s"), Some(90_000));
    assert_eq!(iv("500ms"), Some(500));
    assert_eq!(iv("1.5s"), Some(1500));
    assert_eq!(iv("1h"), Some(3_600_000));
    assert_eq!(iv("10us"), Some(1), "sub-millisecond rounds up");
    assert_eq!(iv("0"), Some(30_000), "zero means the default");
    assert_eq!(iv("0s"), Some(30_000));
}

#[test]
fn healthcheck_errors() {
    for (v, shown) in [
        ("5", "5"),
        ("\"2 seconds\"", "2 seconds"),
        ("\"s\"", "s"),
        ("\"1..2s\"", "1..2s"),
        ("\"-1s\"", "-1s"),
    ] {
        assert_eq!(
            err(&svc(&format!("healthcheck: {{test: [CMD, x], interval: {v}}}"))),
            format!("compose: service \"app\" healthcheck interval \"{shown}\" must be a duration like 2s, 1m30s or 500ms")
        );
    }
    assert_eq!(
        err(&svc("healthcheck: {test: [CMD, x], retries: -1}")),
        "compose: service \"app\" healthcheck retries \"-1\" must be a non-negative integer"
    );
    let bad = "compose: service \"app\" healthcheck test must be a string or a list starting with CMD, CMD-SHELL or NONE";
    assert_eq!(err(&svc("healthcheck: {test: [echo, hi]}")), bad);
    assert_eq!(err(&svc("healthcheck: {test: [CMD]}")), bad);
    assert_eq!(err(&svc("healthcheck: {test: []}")), bad);
    assert_eq!(err(&svc("healthcheck: {test: \"\"}")), bad);
    assert_eq!(
        err(&svc("healthcheck: [CMD, x]")),
        "compose: service \"app\" healthcheck must be a mapping, got a list"
    );
}

// ----- user -----------------------------------------------------------------------------

#[test]
fn user_forms() {
    assert_eq!(app(&svc("user: \"1000:1000\"")).user, "1000:1000");
    assert_eq!(app(&svc("user: 1000")).user, "1000");
    assert_eq!(app(&svc("user: postgres")).user, "postgres");
    assert_eq!(app(&svc("")).user, "");
    assert_eq!(
        err(&svc("user: \"1:2:3\"")),
        "compose: service \"app\" user \"1:2:3\" must be uid[:gid] (e.g. \"1000:1000\")"
    );
    assert_eq!(
        err(&svc("user: [1000]")),
        "compose: service \"app\" user \"a list\" must be uid[:gid] (e.g. \"1000:1000\")"
    );
}

// ----- caps -----------------------------------------------------------------------------

fn caps(extra: &str) -> Resources {
    app(&svc(extra)).resources
}

#[test]
fn caps_default_when_unset() {
    assert_eq!(
        caps(""),
        Resources {
            memory_mb: 4096,
            pids: 2048,
            cpus: 2.0
        }
    );
}

#[test]
fn mem_limit_units() {
    let mb = |v: &str| caps(&format!("mem_limit: {v}")).memory_mb;
    assert_eq!(mb("2g"), 2048);
    assert_eq!(mb("512m"), 512);
    assert_eq!(mb("8192k"), 8);
    assert_eq!(mb("2147483648"), 2048);
    assert_eq!(mb("\"536870912\""), 512);
    assert_eq!(mb("512MB"), 512);
    assert_eq!(mb("1GB"), 1024);
    assert_eq!(mb("1gb"), 1024);
    assert_eq!(mb("512MiB"), 512);
    assert_eq!(mb("\"1.5g\""), 1536);
    assert_eq!(mb("\"100 M\""), 100);
    assert_eq!(mb("10000000"), 10, "bytes round up to whole MiB");
    assert_eq!(mb("1t"), 1024 * 1024);
    assert_eq!(mb("0"), 4096, "zero means the default");
}

#[test]
fn mem_limit_errors() {
    assert_eq!(
        err(&svc("mem_limit: lots")),
        "compose: service \"app\" mem_limit \"lots\" must be bytes or a size like 512m or 2g"
    );
    assert_eq!(
        err(&svc("mem_limit: -1")),
        "compose: service \"app\" mem_limit \"-1\" must be bytes or a size like 512m or 2g"
    );
    assert_eq!(
        err(&svc("mem_limit: 1024k")),
        "compose: service \"app\" mem_limit \"1024k\" is below Docker's 6 MiB minimum"
    );
}

#[test]
fn pids_limit() {
    assert_eq!(caps("pids_limit: 512").pids, 512);
    assert_eq!(caps("pids_limit: \"100\"").pids, 100);
    assert_eq!(caps("pids_limit: 0").pids, 2048);
    assert_eq!(
        err(&svc("pids_limit: -1")),
        "compose: service \"app\" pids_limit -1 is refused; set a positive limit (0 means the default 2048)"
    );
    assert_eq!(
        err(&svc("pids_limit: many")),
        "compose: service \"app\" pids_limit \"many\" must be an integer"
    );
}

#[test]
fn cpus_number_or_string() {
    assert_eq!(caps("cpus: 1.5").cpus, 1.5);
    assert_eq!(caps("cpus: \"0.5\"").cpus, 0.5);
    assert_eq!(caps("cpus: 4").cpus, 4.0);
    assert_eq!(caps("cpus: 0").cpus, 2.0);
    assert_eq!(
        err(&svc("cpus: -1")),
        "compose: service \"app\" cpus \"-1\" must be a non-negative number"
    );
    assert_eq!(
        err(&svc("cpus: .nan")),
        "compose: service \"app\" cpus \".nan\" must be a non-negative number"
    );
}

#[test]
fn deploy_limits_apply_where_the_shorthand_is_absent() {
    let d = "deploy:\n  resources:\n    limits: {memory: 512M, cpus: \"0.50\", pids: 100}";
    assert_eq!(
        caps(d),
        Resources {
            memory_mb: 512,
            pids: 100,
            cpus: 0.5
        }
    );
    assert_eq!(
        caps(&format!("{d}\nmem_limit: 1g\ncpus: 3")),
        Resources {
            memory_mb: 1024,
            pids: 100,
            cpus: 3.0
        },
        "the shorthand wins where present"
    );
    assert_eq!(
        caps(&format!("{d}\nmem_limit: 0\npids_limit: 0")),
        Resources {
            memory_mb: 512,
            pids: 100,
            cpus: 0.5
        },
        "a zero shorthand counts as absent"
    );
    assert_eq!(
        err(&svc("deploy: {resources: {limits: {memory: huge}}}")),
        "compose: service \"app\" deploy.resources.limits.memory \"huge\" must be bytes or a size like 512m or 2g"
    );
    assert_eq!(
        err(&svc("deploy: {resources: {limits: {pids: -1}}}")),
        "compose: service \"app\" deploy.resources.limits.pids -1 is refused; set a positive limit (0 means the default 2048)"
    );
}

// ----- x-denv ---------------------------------------------------------------------------

/// A file with an agent-capable service `box` (uid 1000), a root service `db`, and an
/// x-denv block (indented by 2 under `x-denv`).
fn xd(block: &str) -> String {
    let mut s = String::from(
        "services:\n  box: {image: x, user: \"1000:1000\"}\n  db: {image: y}\nx-denv:\n",
    );
    for line in block.lines() {
        s.push_str("  ");
        s.push_str(line);
        s.push('\n');
    }
    s
}

const VERIFIER: &str = "agent: {service: box}\nverifier: {image: g:1, command: [/grade.sh], collect: [/home/a/answer.txt]}";

#[test]
fn x_denv_defaults() {
    let spec = ok("services: {a: {image: x}}\n");
    assert_eq!(spec.egress, Egress::Deny);
    assert_eq!(spec.kind, "");
    assert!(spec.warm.is_empty());
    assert_eq!((spec.agent, spec.verifier, spec.clock), (None, None, None));
    assert_eq!(ok(&xd("{}")).egress, Egress::Deny);
}

#[test]
fn x_denv_must_be_a_mapping() {
    assert_eq!(
        err("services: {a: {image: x}}\nx-denv: [a]\n"),
        "compose: x-denv must be a mapping, got a list"
    );
}

#[test]
fn kind_is_carried() {
    assert_eq!(ok(&xd("kind: rl-environment")).kind, "rl-environment");
    assert_eq!(
        err(&xd("kind: [a]")),
        "compose: x-denv.kind must be a string, got a list"
    );
}

#[test]
fn egress_deny_or_allow() {
    assert_eq!(ok(&xd("egress: allow")).egress, Egress::Allow);
    assert_eq!(ok(&xd("egress: deny")).egress, Egress::Deny);
    assert_eq!(
        err(&xd("egress: open")),
        "compose: x-denv.egress must be deny or allow, got \"open\""
    );
    assert_eq!(
        err(&xd("egress: false")),
        "compose: x-denv.egress must be deny or allow, got \"false\""
    );
    assert_eq!(
        err(&xd("egress: Allow")),
        "compose: x-denv.egress must be deny or allow, got \"Allow\""
    );
    assert_eq!(
        err(&xd("egress: \"\"")),
        "compose: x-denv.egress must be deny or allow, got \"\""
    );
}

#[test]
fn warm_is_argv() {
    assert_eq!(
        ok(&xd("warm: [psql, -f, /seed/orders.sql]")).warm,
        ["psql", "-f", "/seed/orders.sql"]
    );
    assert_eq!(
        ok(&xd("warm: [\"psql -h db -f /seed.sql\"]")).warm,
        ["psql -h db -f /seed.sql"],
        "list items are argv elements exactly as written"
    );
    assert_eq!(
        ok(&xd("warm: \"psql -h db\"")).warm,
        ["psql", "-h", "db"],
        "a string is split on whitespace"
    );
    assert!(ok(&xd("warm: []")).warm.is_empty());
    assert_eq!(
        err(&xd("warm: [{a: b}]")),
        "compose: x-denv.warm must be a list of strings (argv)"
    );
    assert_eq!(
        err(&xd("warm: {a: b}")),
        "compose: x-denv.warm must be a list of strings (argv)"
    );
}

#[test]
fn clock_frozen_or_real() {
    assert_eq!(ok(&xd("clock: frozen")).clock, Some(Clock::Frozen));
    assert_eq!(ok(&xd("clock: real")).clock, Some(Clock::Real));
    assert_eq!(
        err(&xd("clock: paused")),
        "compose: x-denv.clock must be frozen or real, got \"paused\""
    );
}

#[test]
fn agent_service_is_carried() {
    let spec = ok(&xd("agent: {service: box}"));
    assert_eq!(spec.agent.map(|a| a.service), Some("box".to_string()));
}

#[test]
fn agent_service_must_not_be_root() {
    let msg = "compose: x-denv.agent.service \"db\" must set a non-root user (user: \"1000:1000\"); the agent is never root";
    for user in [
        "",
        "user: \"\"",
        "user: 0",
        "user: \"0\"",
        "user: root",
        "user: \"0:0\"",
        "user: \"root:root\"",
        "user: \"0:1000\"",
        "user: ROOT",
    ] {
        let y = format!(
            "services:\n  db:\n    image: y\n    {user}\nx-denv:\n  agent: {{service: db}}\n"
        );
        assert_eq!(err(&y), msg, "user line {user:?}");
    }
}

#[test]
fn agent_service_must_exist() {
    assert_eq!(
        err(&xd("agent: {service: ghost}")),
        "compose: x-denv.agent.service \"ghost\" is not a service in this file"
    );
    assert_eq!(
        err(&xd("agent: {}")),
        "compose: x-denv.agent.service is required: the service the agent runs in"
    );
    assert_eq!(
        err(&xd("agent: box")),
        "compose: x-denv.agent must be a mapping like { service: opsbox }"
    );
}

#[test]
fn verifier_is_carried_with_defaults() {
    let v = ok(&xd(VERIFIER)).verifier.expect("verifier");
    assert_eq!(v.image.as_deref(), Some("g:1"));
    assert_eq!(v.service, None);
    assert_eq!(v.command, ["/grade.sh"]);
    assert_eq!(v.collect, ["/home/a/answer.txt"]);
    assert_eq!(v.timeout_sec, 600);
    let v = ok(&xd("agent: {service: box}\nverifier: {service: db, command: \"judge --step one\", collect: /out, timeout_sec: 300}"))
        .verifier
        .expect("verifier");
    assert_eq!((v.image, v.service.as_deref()), (None, Some("db")));
    assert_eq!(v.command, ["judge", "--step", "one"]);
    assert_eq!(v.collect, ["/out"]);
    assert_eq!(v.timeout_sec, 300);
}

#[test]
fn verifier_needs_exactly_one_of_image_or_service() {
    let msg = "compose: x-denv.verifier needs exactly one of image or service";
    assert_eq!(
        err(&xd("agent: {service: box}\nverifier: {command: [x]}")),
        msg
    );
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {image: g, service: db, command: [x]}"
        )),
        msg
    );
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {image: \"\", command: [x]}"
        )),
        msg
    );
}

#[test]
fn verifier_service_must_exist() {
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {service: grader, command: [x]}"
        )),
        "compose: x-denv.verifier.service \"grader\" is not a service in this file"
    );
}

#[test]
fn verifier_command_is_required() {
    let msg = "compose: x-denv.verifier.command is required";
    assert_eq!(err(&xd("agent: {service: box}\nverifier: {image: g}")), msg);
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {image: g, command: []}"
        )),
        msg
    );
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {image: g, command: \"  \"}"
        )),
        msg
    );
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {image: g, command: {a: b}}"
        )),
        "compose: x-denv.verifier.command must be a string or a list of strings"
    );
}

#[test]
fn verifier_collect_paths_must_be_absolute() {
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {image: g, command: [x], collect: [home/a.txt]}"
        )),
        "compose: x-denv.verifier.collect path \"home/a.txt\" must be absolute"
    );
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {image: g, command: [x], collect: [/home/../../etc]}"
        )),
        "compose: x-denv.verifier.collect path \"/home/../../etc\" must not contain \"..\""
    );
    assert_eq!(
        err(&xd(
            "agent: {service: box}\nverifier: {image: g, command: [x], collect: {a: b}}"
        )),
        "compose: x-denv.verifier.collect must be a list of absolute paths"
    );
}

#[test]
fn verifier_requires_agent_service() {
    assert_eq!(
        err(&xd("verifier: {image: g, command: [x], collect: [/a]}")),
        "compose: x-denv.verifier requires x-denv.agent.service, the service whose paths are collected"
    );
}

#[test]
fn verifier_timeout() {
    assert_eq!(
        ok(&xd(&format!("{VERIFIER}\n")))
            .verifier
            .map(|v| v.timeout_sec),
        Some(600)
    );
    let t = |v: &str| {
        xd(&format!(
            "agent: {{service: box}}\nverifier: {{image: g, command: [x], timeout_sec: {v}}}"
        ))
    };
    assert_eq!(
        ok(&t("0")).verifier.map(|v| v.timeout_sec),
        Some(600),
        "zero means the default"
    );
    assert_eq!(ok(&t("120")).verifier.map(|v| v.timeout_sec), Some(120));
    assert_eq!(
        err(&t("-5")),
        "compose: x-denv.verifier.timeout_sec \"-5\" must be a positive integer (seconds)"
    );
    assert_eq!(
        err(&xd("verifier: [a]")),
        "compose: x-denv.verifier must be a mapping"
    );
}

// ----- order of checks ------------------------------------------------------------------

#[test]
fn first_problem_in_sorted_service_order_wins() {
    let y = "services:\n  zeta: {build: .}\n  alpha: {image: x, volumes: [\"/etc:/etc\"]}\n";
    assert_eq!(
        err(y),
        "compose: service \"alpha\" bind-mounts \"/etc\"; only named volumes are forkable"
    );
}

#[test]
fn within_a_service_image_comes_first_then_network_then_privileges() {
    assert_eq!(
        err("services:\n  a: {privileged: true, network_mode: host}\n"),
        "compose: service \"a\" has no image and no build"
    );
    assert_eq!(
        err("services:\n  a: {image: x, privileged: true, network_mode: host}\n"),
        "compose: service \"a\" uses network_mode: host, which cannot be forked"
    );
    assert_eq!(
        err("services:\n  a: {image: x, privileged: true, devices: [/dev/kvm]}\n"),
        "compose: service \"a\" asks for privileged, which is refused"
    );
    assert_eq!(
        err("services:\n  a: {image: x, user: \"a:b:c\", ports: [\"53/udp\"]}\n"),
        "compose: service \"a\" user \"a:b:c\" must be uid[:gid] (e.g. \"1000:1000\")"
    );
}

#[test]
fn services_before_cycles_before_x_denv() {
    assert_eq!(
        err("x-denv: {egress: open}\nservices:\n  a: {image: x, depends_on: [a]}\n  b: {}\n"),
        "compose: service \"b\" has no image and no build"
    );
    assert_eq!(
        err("x-denv: {egress: open}\nservices:\n  a: {image: x, depends_on: [a]}\n"),
        "compose: depends_on cycle: a -> a"
    );
    assert_eq!(
        err("x-denv: {egress: open, agent: {service: a}}\nservices:\n  a: {image: x}\n"),
        "compose: x-denv.egress must be deny or allow, got \"open\""
    );
}

#[test]
fn top_level_volumes_before_services() {
    assert_eq!(
        err("services:\n  a: {}\nvolumes: {v: {external: true}}\n"),
        "compose: volume \"v\" is external, which is refused; denv creates and forks every volume itself"
    );
}

#[test]
fn verifier_checks_in_documented_order() {
    // exactly-one before command before collect before requires-agent.
    assert_eq!(
        err(&xd("verifier: {collect: [rel]}")),
        "compose: x-denv.verifier needs exactly one of image or service"
    );
    assert_eq!(
        err(&xd("verifier: {image: g, collect: [rel]}")),
        "compose: x-denv.verifier.command is required"
    );
    assert_eq!(
        err(&xd("verifier: {image: g, command: [x], collect: [rel]}")),
        "compose: x-denv.verifier.collect path \"rel\" must be absolute"
    );
}

// ----- is_root_user ---------------------------------------------------------------------

#[test]
fn root_users() {
    for u in [
        "",
        " ",
        "0",
        "00",
        "+0",
        "root",
        "ROOT",
        "0:0",
        "root:root",
        "0:1000",
        "root:1000",
        " 0 ",
        "-0",
        "0x0",
        "agent",
        "postgres",
        "nobody:nogroup",
        "rooty",
    ] {
        assert!(is_root_user(u), "{u:?} is root");
    }
    for u in [
        "1000",
        "1000:1000",
        "1000:0",
        "65534",
        " 1000 ",
        "1000:agent",
    ] {
        assert!(!is_root_user(u), "{u:?} is not root");
    }
}

#[test]
fn a_user_string_is_one_user_and_nothing_else() {
    use denv_compose::is_valid_user;
    for ok in [
        "root",
        "0",
        "1000",
        "1000:1000",
        "www-data",
        "www-data:www-data",
        "a.b_c-d",
        "nobody:0",
    ] {
        assert!(is_valid_user(ok), "{ok}");
    }
    let long = "a".repeat(65);
    for bad in [
        "", ":", "a:", ":a", "a:b:c", "-1", "a:-g", "root;id", "0 -u", "$(id)", "`id`", "ro ot",
        "root\n", "root\0", "ä", "a/b", &long,
    ] {
        assert!(!is_valid_user(bad), "{bad:?}");
    }
}

// ----- x-denv.promote ------------------------------------------------------------------

#[test]
fn promote_gates_are_declared_checks() {
    let spec = ok(&xd(r#"promote:
  replay:
    forks: 3
    commands:
      - {service: db, cmd: [psql, -c, "select 1"]}
      - {name: files, service: box, cmd: "ls /home | wc -l"}
  consistency:
    - {service: db, cmd: [pg_amcheck, --all]}
  invariants:
    - {name: orders kept, service: db, cmd: [sh, -c, "test -s /data/orders"]}
  soak: 1m30s"#));
    let p = spec.promote.expect("promote");
    assert_eq!(p.forks(), 3);
    assert_eq!(
        p.replay[0],
        denv_compose::Check {
            name: "psql -c select 1".into(),
            service: "db".into(),
            cmd: vec!["psql".into(), "-c".into(), "select 1".into()],
        }
    );
    // A string runs through sh -c and names itself by the script.
    assert_eq!(p.replay[1].name, "files");
    assert_eq!(p.replay[1].cmd, ["sh", "-c", "ls /home | wc -l"]);
    assert_eq!(p.consistency[0].name, "pg_amcheck --all");
    assert_eq!(p.invariants[0].name, "orders kept");
    assert_eq!(p.soak_ms, 90_000);
    // Unset: the default replay forks, no soak.
    let p = ok(&xd("promote: {}")).promote.unwrap();
    assert_eq!((p.forks(), p.soak_ms), (2, 0));
    assert_eq!(ok(&xd("kind: x")).promote, None);
}

#[test]
fn promote_refusals_name_the_key() {
    assert_eq!(
        err(&xd("promote: [a]")),
        "compose: x-denv.promote must be a mapping"
    );
    assert_eq!(
        err(&xd("promote: {gates: 1}")),
        "compose: x-denv.promote.gates is not a key of x-denv.promote (replay, consistency, invariants, soak)"
    );
    assert_eq!(
        err(&xd("promote: {replay: {forks: 1}}")),
        "compose: x-denv.promote.replay.forks \"1\" must be a whole number from 2 to 8"
    );
    assert_eq!(
        err(&xd("promote: {replay: {forks: 9}}")),
        "compose: x-denv.promote.replay.forks \"9\" must be a whole number from 2 to 8"
    );
    assert_eq!(
        err(&xd("promote: {invariants: [{service: nope, cmd: [true]}]}")),
        "compose: x-denv.promote.invariants[0].service \"nope\" is not a service in this file"
    );
    assert_eq!(
        err(&xd("promote: {consistency: [{cmd: [true]}]}")),
        "compose: x-denv.promote.consistency[0].service is required"
    );
    assert_eq!(
        err(&xd("promote: {replay: {commands: [{service: db}]}}")),
        "compose: x-denv.promote.replay.commands[0].cmd is required (a list of strings or a shell string)"
    );
    assert_eq!(
        err(&xd("promote: {invariants: [{service: db, cmd: []}]}")),
        "compose: x-denv.promote.invariants[0].cmd must be a non-empty list of strings or a shell string"
    );
    assert_eq!(
        err(&xd("promote: {invariants: {service: db}}")),
        "compose: x-denv.promote.invariants must be a list of {service, cmd} checks"
    );
    assert_eq!(
        err(&xd("promote: {soak: 11m}")),
        "compose: x-denv.promote.soak \"11m\" must be a duration like 30s or 5m (at most 10m)"
    );
    assert_eq!(
        err(&xd("promote: {soak: soon}")),
        "compose: x-denv.promote.soak \"soon\" must be a duration like 30s or 5m (at most 10m)"
    );
    assert_eq!(ok(&xd("promote: {soak: 0}")).promote.unwrap().soak_ms, 0);
}
