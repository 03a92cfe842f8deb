fn main() {
    println!("dirseal");
}
