//! Breadth, not speed: many locks at once, each granting all its claims in creation
//! order with strictly increasing tokens (the scale benchmark's workload, untimed).

use std::time::Duration;

use leasehold::testing::scale::{drive, prepare};

use crate::support::*;

#[tokio::test]
async fn two_hundred_locks_of_five_claimants_each_grant_every_claim_in_fifo_and_token_order() {
    let client = client().await;
    let ns = format!("t-scale-{:06x}", rand::random::<u32>() & 0xffffff);
    let workload = prepare(&client, &ns, 200, 5).await.expect("locks, pods and claims");
    let _c = spawn_controller_with(
        client.clone(),
        leasehold::controller::Options::single("scale", Some(&ns)),
    );
    let out = drive(&client, &workload, None, Duration::from_secs(900))
        .await
        .expect("every claim granted");
    assert_eq!(out.grants, 200 * 5);
    assert!(
        out.violations.is_empty(),
        "FIFO or token order broken: {:?}",
        out.violations
    );
    assert_eq!(out.handoffs.len(), 200 * 4, "every release led to the next grant");
}
