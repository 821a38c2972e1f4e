fn main() {
    for n in [1000usize, 2000, 4000, 8000] {
        for (label, open) in [("[", "["), ("{", "{a: "), ("- ", "- ")] {
            let text = format!("services: {}", open.repeat(n));
            let t = std::time::Instant::now();
            let r = serde_yaml::from_str::<serde_yaml::Value>(&text);
            println!("{label} n={n} {:?} {:?}", t.elapsed(), r.err().map(|e| e.to_string()));
        }
    }
}
