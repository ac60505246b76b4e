mod common;
use common::*;
#[tokio::test]
async fn probe() {
    let t = std::time::Instant::now();
    let r = run("try { exit() } finally { while (true) {} }").await;
    println!("{:?} {:?}", t.elapsed(), r);
}
