//! Listing a server's tools, prompts and resources page by page, within bounds.
//!
//! rmcp's `list_all_*` follow `nextCursor` for as long as the server sends one, keeping every
//! page: a server that always answers with another cursor (a bug, or on purpose) makes the host
//! list forever and grow until it is killed. Here a listing stops at a repeated cursor or at a
//! ceiling on pages, items or bytes, keeps what it has, and says what was left out.

use std::collections::HashSet;
use std::future::Future;

use rmcp::RoleClient;
use rmcp::ServiceError;
use rmcp::model::{PaginatedRequestParams, Prompt, Resource, ResourceTemplate};
use rmcp::service::Peer;
use serde::Serialize;

use super::tool::ListedTool;

/// Bounds on one listing of one server.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// Most items kept. Real servers list tens to hundreds of tools.
    pub items: usize,
    /// Most pages requested.
    pub pages: usize,
    /// Most bytes of items kept, counted as their JSON.
    pub bytes: usize,
}

pub(crate) const BOUNDS: Bounds = Bounds {
    items: 5_000,
    pages: 500,
    bytes: 64 * 1024 * 1024,
};

/// What a listing kept, and why it stopped early if it did.
#[derive(Debug)]
pub(crate) struct Listed<T> {
    pub items: Vec<T>,
    pub cut: Option<String>,
}

/// Follows cursors from `page` until the server sends none, or a bound or a repeated cursor
/// stops the listing.
pub(crate) async fn list_bounded<T, Fut>(
    what: &str,
    bounds: Bounds,
    page: impl FnMut(Option<String>) -> Fut,
) -> Result<Listed<T>, ServiceError>
where
    T: Serialize,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), ServiceError>>,
{
    list_bounded_as(what, bounds, page, |item| item).await
}

/// [`list_bounded`], keeping each item as `keep` makes it once it is counted, page by page: a
/// page's raw items are dropped before the next is asked for, so a large listing is never held
/// whole in its raw form.
pub(crate) async fn list_bounded_as<T, U, Fut>(
    what: &str,
    bounds: Bounds,
    mut page: impl FnMut(Option<String>) -> Fut,
    mut keep: impl FnMut(T) -> U,
) -> Result<Listed<U>, ServiceError>
where
    T: Serialize,
    Fut: Future<Output = Result<(Vec<T>, Option<String>), ServiceError>>,
{
    let mut items = Vec::new();
    let mut bytes = 0usize;
    let mut seen = HashSet::new();
    let mut cursor = None;
    for pages in 1.. {
        let (got, next) = page(cursor.take()).await?;
        for item in got {
            if items.len() == bounds.items {
                return Ok(cut(
                    items,
                    what,
                    format!("more than {} {what}", bounds.items),
                ));
            }
            bytes = bytes.saturating_add(serde_json::to_vec(&item).map_or(0, |v| v.len()));
            if bytes > bounds.bytes {
                return Ok(cut(
                    items,
                    what,
                    format!("{what} over {}", size(bounds.bytes)),
                ));
            }
            items.push(keep(item));
        }
        let Some(next) = next else {
            return Ok(Listed { items, cut: None });
        };
        if !seen.insert(next.clone()) {
            return Ok(cut(
                items,
                what,
                format!("the cursor `{}` again", short(&next)),
            ));
        }
        if pages == bounds.pages {
            return Ok(cut(
                items,
                what,
                format!("more than {} pages", bounds.pages),
            ));
        }
        cursor = Some(next);
    }
    unreachable!("the loop returns")
}

fn cut<T>(items: Vec<T>, what: &str, why: String) -> Listed<T> {
    let cut = format!(
        "the server sent {why} when asked for its {what}; codemode kept the first {} and left \
         out the rest",
        items.len()
    );
    Listed {
        items,
        cut: Some(cut),
    }
}

fn size(bytes: usize) -> String {
    if bytes >= 1024 * 1024 {
        format!("{} MiB", bytes / (1024 * 1024))
    } else {
        format!("{bytes} bytes")
    }
}

fn short(s: &str) -> String {
    match s.char_indices().nth(40) {
        Some((at, _)) => format!("{}…", &s[..at]),
        None => s.to_string(),
    }
}

fn params(cursor: Option<String>) -> Option<PaginatedRequestParams> {
    Some(PaginatedRequestParams::default().with_cursor(cursor))
}

/// The tools, their schemas converted as each page arrives (see [`ListedTool`]).
pub(crate) async fn tools(
    peer: &Peer<RoleClient>,
    bounds: Bounds,
) -> Result<Listed<ListedTool>, ServiceError> {
    list_bounded_as(
        "tools",
        bounds,
        |c| async {
            let r = peer.list_tools(params(c)).await?;
            Ok((r.tools, r.next_cursor))
        },
        ListedTool::new,
    )
    .await
}

pub(crate) async fn prompts(
    peer: &Peer<RoleClient>,
    bounds: Bounds,
) -> Result<Listed<Prompt>, ServiceError> {
    list_bounded("prompts", bounds, |c| async {
        let r = peer.list_prompts(params(c)).await?;
        Ok((r.prompts, r.next_cursor))
    })
    .await
}

pub(crate) async fn resources(
    peer: &Peer<RoleClient>,
    bounds: Bounds,
) -> Result<Listed<Resource>, ServiceError> {
    list_bounded("resources", bounds, |c| async {
        let r = peer.list_resources(params(c)).await?;
        Ok((r.resources, r.next_cursor))
    })
    .await
}

pub(crate) async fn resource_templates(
    peer: &Peer<RoleClient>,
    bounds: Bounds,
) -> Result<Listed<ResourceTemplate>, ServiceError> {
    list_bounded("resource templates", bounds, |c| async {
        let r = peer.list_resource_templates(params(c)).await?;
        Ok((r.resource_templates, r.next_cursor))
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> Bounds {
        Bounds {
            items: 10,
            pages: 5,
            bytes: 1000,
        }
    }

    #[tokio::test]
    async fn an_endless_cursor_stops_at_the_item_bound() {
        let listed = list_bounded("tools", small(), |c| async move {
            let n: u32 = c.as_deref().unwrap_or("0").parse().unwrap();
            Ok((vec![n, n + 1, n + 2], Some((n + 3).to_string())))
        })
        .await
        .unwrap();
        assert_eq!(listed.items, (0..10).collect::<Vec<u32>>());
        let why = listed.cut.unwrap();
        assert!(
            why.contains("more than 10 tools") && why.contains("first 10"),
            "{why}"
        );
    }

    #[tokio::test]
    async fn a_repeated_cursor_stops_the_listing() {
        let listed = list_bounded("tools", small(), |_| async {
            Ok((vec![1u8], Some("again".into())))
        })
        .await
        .unwrap();
        assert_eq!(listed.items, [1, 1]);
        assert!(listed.cut.unwrap().contains("the cursor `again` again"));
    }

    #[tokio::test]
    async fn empty_pages_stop_at_the_page_bound() {
        let mut n = 0;
        let listed = list_bounded("prompts", small(), |_| {
            n += 1;
            let cursor = n.to_string();
            async move { Ok((Vec::<u8>::new(), Some(cursor))) }
        })
        .await
        .unwrap();
        assert!(listed.items.is_empty());
        assert_eq!(n, 5);
        assert!(listed.cut.unwrap().contains("more than 5 pages"));
    }

    #[tokio::test]
    async fn large_items_stop_at_the_byte_bound() {
        let listed = list_bounded("tools", small(), |_| async {
            Ok((vec!["x".repeat(400); 4], None))
        })
        .await
        .unwrap();
        assert_eq!(listed.items.len(), 2);
        assert!(listed.cut.unwrap().contains("tools over 1000 bytes"));
    }

    #[tokio::test]
    async fn a_listing_within_bounds_is_whole() {
        let listed = list_bounded("tools", small(), |c| async move {
            match c.as_deref() {
                None => Ok((vec![1, 2], Some("p2".into()))),
                _ => Ok((vec![3], None)),
            }
        })
        .await
        .unwrap();
        assert_eq!(listed.items, [1, 2, 3]);
        assert!(listed.cut.is_none());
    }
}
