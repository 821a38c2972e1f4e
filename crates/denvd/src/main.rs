fn main() {
    println!("denvd dev");
}
