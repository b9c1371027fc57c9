"""`LetheStore` against a live Lethe: LangGraph's own store tests, ported, then what Lethe adds.

Ported from langchain-ai/langgraph, libs/checkpoint-postgres/tests/test_store.py and test_async_store.py (the tests
LangGraph runs against its PostgresStore; langgraph-checkpoint-conformance ships none for stores). Bodies are kept as
written; where one differs, a comment says why:
- each test gets a fresh `scope` (LangGraph creates a fresh database per test);
- the fixture's default TTL is 10 minutes instead of 6 seconds, so no item expires while a test runs on a loaded
  machine; expiry is forced with `ttl=0` (expired at its own write) instead of sleeping or backdating rows in SQL;
- the vector tests use Lethe's embedder (all-MiniLM-L6-v2) instead of LangGraph's CharacterEmbeddings fake, so they
  keep the assertions that are about ranking, not about that fake's exact geometry, and `index=False` per item is not
  supported (the server embeds per request, see docs/langgraph.md).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from langgraph.store.base import (
    GetOp,
    InvalidNamespaceError,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    SearchOp,
)
from lethe_client.errors import ValidationError
from lethe_client.langgraph import DeletedWhileWriting, LetheStore
from lethe_client.langgraph.store import key_name, namespace_name

TTL = {"default_ttl": 10.0, "refresh_on_read": True}


@pytest.fixture
def make_store(lethe_url: str, lethe_key: str, unique: str) -> Iterator[Callable[..., LetheStore]]:
    made: list[LetheStore] = []

    def make(**options: Any) -> LetheStore:
        store = LetheStore(lethe_url, lethe_key, scope=(f"lg{unique}",), ttl=TTL, **options)  # type: ignore[arg-type]
        made.append(store)
        return store

    yield make
    for store in made:
        store.close()


@pytest.fixture
def store(make_store: Callable[..., LetheStore]) -> LetheStore:
    return make_store()


@pytest.fixture
def vector_store(make_store: Callable[..., LetheStore]) -> LetheStore:
    return make_store(index={"fields": ["text"]})


@pytest.fixture
async def astore(lethe_url: str, lethe_key: str, unique: str) -> AsyncIterator[LetheStore]:
    store = LetheStore(lethe_url, lethe_key, scope=(f"lg{unique}",), ttl=TTL)  # type: ignore[arg-type]
    yield store
    await store.aclose()


@pytest.fixture
def raw(lethe_url: str, lethe_key: str) -> Iterator[httpx.Client]:
    """Lethe's own API, to look at what the store left there."""
    with httpx.Client(base_url=lethe_url, headers={"Authorization": f"Bearer {lethe_key}"}, timeout=60) as client:
        yield client


def _record(raw: httpx.Client, store: LetheStore, namespace: tuple[str, ...], key: str, suffix: str = "") -> Any:
    name, key = quote(namespace_name(store.scope, namespace), safe=""), quote(key_name(key), safe="")
    return raw.get(f"/v1/memory/{name}/{key}{suffix}")


# ---- ported: libs/checkpoint-postgres/tests/test_store.py --------------------------------------------------------


def test_batch_order(store: LetheStore) -> None:
    store.put(("test", "foo"), "key1", {"data": "value1"})
    store.put(("test", "bar"), "key2", {"data": "value2"})

    ops: list[Op] = [
        GetOp(namespace=("test", "foo"), key="key1"),
        PutOp(namespace=("test", "bar"), key="key2", value={"data": "value2"}),
        SearchOp(namespace_prefix=("test",), filter={"data": "value1"}, limit=10, offset=0),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        GetOp(namespace=("test",), key="key3"),
    ]

    results = store.batch(ops)
    assert len(results) == 5
    assert isinstance(results[0], Item)
    assert isinstance(results[0].value, dict)
    assert results[0].value == {"data": "value1"}
    assert results[0].key == "key1"
    assert results[1] is None
    assert isinstance(results[2], list)
    assert len(results[2]) == 1
    assert isinstance(results[3], list)
    assert len(results[3]) > 0
    assert results[4] is None

    ops_reordered: list[Op] = [
        SearchOp(namespace_prefix=("test",), filter=None, limit=5, offset=0),
        GetOp(namespace=("test", "bar"), key="key2"),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=5, offset=0),
        PutOp(namespace=("test",), key="key3", value={"data": "value3"}),
        GetOp(namespace=("test", "foo"), key="key1"),
    ]

    results_reordered: list[Any] = store.batch(ops_reordered)
    assert len(results_reordered) == 5
    assert isinstance(results_reordered[0], list)
    assert len(results_reordered[0]) >= 2
    assert isinstance(results_reordered[1], Item)
    assert results_reordered[1].value == {"data": "value2"}
    assert results_reordered[1].key == "key2"
    assert isinstance(results_reordered[2], list)
    assert len(results_reordered[2]) > 0
    assert results_reordered[3] is None
    assert isinstance(results_reordered[4], Item)
    assert results_reordered[4].value == {"data": "value1"}
    assert results_reordered[4].key == "key1"


def test_batch_get_ops(store: LetheStore) -> None:
    store.put(("test",), "key1", {"data": "value1"})
    store.put(("test",), "key2", {"data": "value2"})

    ops = [
        GetOp(namespace=("test",), key="key1"),
        GetOp(namespace=("test",), key="key2"),
        GetOp(namespace=("test",), key="key3"),
    ]
    results = store.batch(ops)

    assert len(results) == 3
    assert results[0] is not None and results[1] is not None
    assert results[2] is None
    assert isinstance(results[0], Item) and results[0].key == "key1"
    assert isinstance(results[1], Item) and results[1].key == "key2"


def test_batch_put_ops(store: LetheStore) -> None:
    ops = [
        PutOp(namespace=("test",), key="key1", value={"data": "value1"}),
        PutOp(namespace=("test",), key="key2", value={"data": "value2"}),
        PutOp(namespace=("test",), key="key3", value=None),
    ]
    results = store.batch(ops)
    assert len(results) == 3
    assert all(result is None for result in results)

    item1 = store.get(("test",), "key1")
    item2 = store.get(("test",), "key2")
    item3 = store.get(("test",), "key3")
    assert item1 and item1.value == {"data": "value1"}
    assert item2 and item2.value == {"data": "value2"}
    assert item3 is None


def test_batch_search_ops(store: LetheStore) -> None:
    test_data = [
        (("test", "foo"), "key1", {"data": "value1", "tag": "a"}),
        (("test", "bar"), "key2", {"data": "value2", "tag": "a"}),
        (("test", "baz"), "key3", {"data": "value3", "tag": "b"}),
    ]
    for namespace, key, value in test_data:
        store.put(namespace, key, value)

    ops = [
        SearchOp(namespace_prefix=("test",), filter={"tag": "a"}, limit=10, offset=0),
        SearchOp(namespace_prefix=("test",), filter=None, limit=2, offset=0),
        SearchOp(namespace_prefix=("test", "foo"), filter=None, limit=10, offset=0),
    ]
    results: list[Any] = store.batch(ops)
    assert len(results) == 3
    assert len(results[0]) == 2
    assert all(item.value["tag"] == "a" for item in results[0])
    assert len(results[1]) == 2
    assert len(results[2]) == 1
    assert results[2][0].namespace == ("test", "foo")


def test_batch_list_namespaces_ops(store: LetheStore) -> None:
    test_data = [
        (("test", "documents", "public"), "doc1", {"content": "public doc"}),
        (("test", "documents", "private"), "doc2", {"content": "private doc"}),
        (("test", "images", "public"), "img1", {"content": "public image"}),
        (("prod", "documents", "public"), "doc3", {"content": "prod doc"}),
    ]
    for namespace, key, value in test_data:
        store.put(namespace, key, value)

    ops = [
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        ListNamespacesOp(match_conditions=None, max_depth=2, limit=10, offset=0),
        ListNamespacesOp(match_conditions=(MatchCondition("suffix", ("public",)),), max_depth=None, limit=10,
                         offset=0),
    ]
    results: list[Any] = store.batch(ops)
    assert len(results) == 3
    assert len(results[0]) == len(test_data)
    assert all(len(ns) <= 2 for ns in results[1])
    assert all(ns[-1] == "public" for ns in results[2])


def test_basic_store_ops(store: LetheStore) -> None:
    namespace = ("test", "documents")
    item_id = "doc1"
    item_value = {"title": "Test Document", "content": "Hello, World!"}

    store.put(namespace, item_id, item_value)
    item = store.get(namespace, item_id)
    assert item
    assert item.namespace == namespace
    assert item.key == item_id
    assert item.value == item_value

    updated_value = {"title": "Updated Document", "content": "Hello, Updated!"}
    store.put(namespace, item_id, updated_value)
    updated_item = store.get(namespace, item_id)
    assert updated_item is not None
    assert updated_item.value == updated_value
    assert updated_item.updated_at > item.updated_at

    assert store.get(("test", "other_documents"), item_id) is None

    store.delete(namespace, item_id)
    assert store.get(namespace, item_id) is None


def test_list_namespaces(store: LetheStore) -> None:
    test_namespaces = [
        ("test", "documents", "public"),
        ("test", "documents", "private"),
        ("test", "images", "public"),
        ("test", "images", "private"),
        ("prod", "documents", "public"),
        ("prod", "documents", "private"),
    ]
    for namespace in test_namespaces:
        store.put(namespace, "dummy", {"content": "dummy"})

    assert len(store.list_namespaces()) == len(test_namespaces)
    test_prefix_namespaces = store.list_namespaces(prefix=("test",))
    assert len(test_prefix_namespaces) == 4
    assert all(ns[0] == "test" for ns in test_prefix_namespaces)
    public_namespaces = store.list_namespaces(suffix=("public",))
    assert len(public_namespaces) == 3
    assert all(ns[-1] == "public" for ns in public_namespaces)
    assert all(len(ns) <= 2 for ns in store.list_namespaces(max_depth=2))
    assert len(store.list_namespaces(limit=3)) == 3

    for namespace in test_namespaces:
        store.delete(namespace, "dummy")
    # Lethe: a namespace whose keys are all forgotten is no longer listed
    assert store.list_namespaces() == []


def test_search_namespace_segment_boundary(store: LetheStore) -> None:
    for namespace in [("foo",), ("foo", "child"), ("foo", "child", "deep"), ("foobar",), ("foobar", "baz"), ("foo2",)]:
        store.put(namespace, "k", {"v": 1})

    def _namespaces(prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        return {item.namespace for item in store.search(prefix, limit=100)}

    assert _namespaces(("foo",)) == {("foo",), ("foo", "child"), ("foo", "child", "deep")}
    assert _namespaces(("foobar",)) == {("foobar",), ("foobar", "baz")}
    assert _namespaces(("foo", "child")) == {("foo", "child"), ("foo", "child", "deep")}
    assert _namespaces(("foo2",)) == {("foo2",)}
    assert _namespaces(("fo",)) == set()


def test_search_empty_prefix_is_unconstrained(store: LetheStore) -> None:
    for namespace in [("a",), ("b", "c"), ("d", "e", "f")]:
        store.put(namespace, "k", {"v": 1})
    assert {item.namespace for item in store.search((), limit=100)} == {("a",), ("b", "c"), ("d", "e", "f")}


def test_search_namespace_like_metacharacters(store: LetheStore) -> None:
    for namespace in [("user_1",), ("user_1", "child"), ("userX1",), ("a%b",), ("axxb",)]:
        store.put(namespace, "k", {"v": 1})

    def _namespaces(prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        return {item.namespace for item in store.search(prefix, limit=100)}

    assert _namespaces(("user_1",)) == {("user_1",), ("user_1", "child")}
    assert _namespaces(("a%b",)) == {("a%b",)}


def test_list_namespaces_segment_boundary(store: LetheStore) -> None:
    for namespace in [
        ("foo",), ("foo", "child"), ("foobar",), ("foobar", "baz"),
        ("uid", "users", "alice"), ("uid", "users", "malice"), ("uid", "a", "b", "alice"),
    ]:
        store.put(namespace, "k", {"v": 1})

    assert set(store.list_namespaces(prefix=("foo",), limit=100)) == {("foo",), ("foo", "child")}
    assert set(store.list_namespaces(suffix=("alice",), limit=100)) == {
        ("uid", "users", "alice"), ("uid", "a", "b", "alice")
    }
    assert set(store.list_namespaces(prefix=("uid", "*", "alice"), limit=100)) == {("uid", "users", "alice")}
    assert set(store.list_namespaces(prefix=("uid",), limit=100)) == {
        ("uid", "users", "alice"), ("uid", "users", "malice"), ("uid", "a", "b", "alice")
    }


def test_search(store: LetheStore) -> None:
    test_data = [
        (("test", "docs"), "doc1", {"title": "First Doc", "author": "Alice", "tags": ["important"]}),
        (("test", "docs"), "doc2", {"title": "Second Doc", "author": "Bob", "tags": ["draft"]}),
        (("test", "images"), "img1", {"title": "Image 1", "author": "Alice", "tags": ["final"]}),
    ]
    for namespace, key, value in test_data:
        store.put(namespace, key, value)

    assert len(store.search(("test",))) == 3
    docs_items = store.search(("test", "docs"))
    assert len(docs_items) == 2
    assert all(item.namespace == ("test", "docs") for item in docs_items)
    alice_items = store.search(("test",), filter={"author": "Alice"})
    assert len(alice_items) == 2
    assert all(item.value["author"] == "Alice" for item in alice_items)
    assert len(store.search(("test",), limit=2)) == 2
    assert len(store.search(("test",), offset=2)) == 1

    for namespace, key, _ in test_data:
        store.delete(namespace, key)


def test_vector_insert_with_auto_embedding(vector_store: LetheStore) -> None:
    docs = [
        ("doc1", {"text": "short text"}),
        ("doc2", {"text": "longer text document"}),
        ("doc3", {"text": "longest text document here"}),
        ("doc4", {"description": "text in description field"}),
        ("doc5", {"content": "text in content field"}),
        ("doc6", {"body": "text in body field"}),
    ]
    for key, value in docs:
        vector_store.put(("test",), key, value)

    results = vector_store.search(("test",), query="long text")
    assert len(results) > 0
    doc_order = [r.key for r in results]
    assert "doc2" in doc_order
    assert "doc3" in doc_order


def test_vector_update_with_embedding(vector_store: LetheStore) -> None:
    vector_store.put(("test",), "doc1", {"text": "zany zebra Xerxes"})
    vector_store.put(("test",), "doc2", {"text": "something about dogs"})
    vector_store.put(("test",), "doc3", {"text": "text about birds"})

    results_initial = vector_store.search(("test",), query="Zany Xerxes")
    assert len(results_initial) > 0
    assert results_initial[0].key == "doc1"
    initial_score = results_initial[0].score
    assert initial_score is not None

    vector_store.put(("test",), "doc1", {"text": "new text about dogs"})
    results_after = vector_store.search(("test",), query="Zany Xerxes")
    after_score = next((r.score for r in results_after if r.key == "doc1"), 0.0)
    assert after_score is not None and after_score < initial_score

    for r in vector_store.search(("test",), query="new text about dogs"):
        if r.key == "doc1":
            assert r.score is not None and r.score > after_score
    # (LangGraph's `index=False` part is not ported: per-item index settings are not supported)


@pytest.mark.parametrize("refresh_ttl", [True, False])
def test_vector_search_with_filters(vector_store: LetheStore, refresh_ttl: bool) -> None:
    docs = [
        ("doc1", {"text": "red apple", "color": "red", "score": 4.5}),
        ("doc2", {"text": "red car", "color": "red", "score": 3.0}),
        ("doc3", {"text": "green apple", "color": "green", "score": 4.0}),
        ("doc4", {"text": "blue car", "color": "blue", "score": 3.5}),
    ]
    for key, value in docs:
        vector_store.put(("test",), key, value)

    results = vector_store.search(("test",), query="apple", filter={"color": "red"}, refresh_ttl=refresh_ttl)
    assert len(results) == 2
    assert results[0].key == "doc1"

    results = vector_store.search(("test",), query="car", filter={"color": "red"}, refresh_ttl=refresh_ttl)
    assert len(results) == 2
    assert results[0].key == "doc2"

    # LangGraph queries "bbbbluuu" here, which ranks "blue car" first only under its character-count fake
    results = vector_store.search(("test",), query="blue", filter={"score": {"$gt": 3.2}}, refresh_ttl=refresh_ttl)
    assert len(results) == 3
    assert results[0].key == "doc4"

    results = vector_store.search(("test",), query="apple", filter={"score": {"$gte": 4.0}, "color": "green"})
    assert len(results) == 1
    assert results[0].key == "doc3"


def test_vector_search_pagination(vector_store: LetheStore) -> None:
    for i in range(5):
        vector_store.put(("test",), f"doc{i}", {"text": f"test document number {i}"})

    results_page1 = vector_store.search(("test",), query="test", limit=2)
    results_page2 = vector_store.search(("test",), query="test", limit=2, offset=2)
    assert len(results_page1) == 2
    assert len(results_page2) == 2
    assert results_page1[0].key != results_page2[0].key
    assert len(vector_store.search(("test",), query="test", limit=10)) == 5


def test_vector_search_edge_cases(vector_store: LetheStore) -> None:
    vector_store.put(("test",), "doc1", {"text": "test document"})
    assert len(vector_store.search(("test",), query="")) == 1
    assert len(vector_store.search(("test",), query=None)) == 1
    assert len(vector_store.search(("test",), query="test " * 100)) == 1
    assert len(vector_store.search(("test",), query="test!@#$%^&*()")) == 1


def test_non_ascii(vector_store: LetheStore) -> None:
    texts = ["这是中文", "これは日本語です", "이건 한국어야", "Это русский", "यह रूसी है"]
    for i, text in enumerate(texts, start=1):
        vector_store.put(("user_123", "memories"), str(i), {"text": text})
    for i, text in enumerate(texts, start=1):
        assert vector_store.search(("user_123", "memories"), query=text)[0].key == str(i)


def test_store_ttl(store: LetheStore) -> None:
    # LangGraph sleeps through a 6-second TTL; here the expiry is forced with ttl=0, the refresh checked on the
    # server's expires_at (below, test_refresh_on_read_restarts_the_time_to_live)
    ns = ("foo",)
    store.put(ns, key="item1", value={"foo": "bar"}, ttl=0)
    assert store.get(ns, key="item1", refresh_ttl=True) is None
    assert store.search(ns, query="foo", refresh_ttl=True) == []


def test_omit_expired_filters_read_paths(store: LetheStore) -> None:
    expired_ns = ("omit", "expired")
    control_ns = ("omit", "control")
    store.put(expired_ns, "e", {"data": "gone"}, ttl=0)
    store.put(control_ns, "c", {"data": "keep"}, ttl=None)

    namespaces = store.list_namespaces(prefix=("omit",))
    assert expired_ns not in namespaces
    assert control_ns in namespaces
    assert store.get(expired_ns, "e") is None
    assert store.get(control_ns, "c") is not None
    assert store.search(expired_ns) == []
    assert [i.key for i in store.search(control_ns)] == ["c"]


def test_omit_expired_search_pagination(store: LetheStore) -> None:
    ns = ("page",)
    store.put(ns, "c", {"k": "c"}, ttl=60)
    store.put(ns, "b", {"k": "b"}, ttl=60)
    store.put(ns, "expired", {"k": "x"}, ttl=0)
    store.put(ns, "a", {"k": "a"}, ttl=60)
    # newest first: a, expired, b, c; the expired one is dropped before the page is cut
    assert [i.key for i in store.search(ns, limit=2, offset=0)] == ["a", "b"]
    assert [i.key for i in store.search(ns, limit=2, offset=2)] == ["c"]


def test_namespace_labels_with_trailing_newline(store: LetheStore) -> None:
    store.put(("users", "alice"), "k", {"v": 1})
    store.put(("users", "alice\n"), "k", {"v": 2})
    assert set(store.list_namespaces(suffix=("alice",), limit=100)) == {("users", "alice")}
    assert set(store.list_namespaces(prefix=("users", "alice"), limit=100)) == {("users", "alice")}


# ---- ported: libs/checkpoint-postgres/tests/test_async_store.py --------------------------------------------------


async def test_no_running_loop_is_not_required(astore: LetheStore) -> None:
    # LangGraph's async store refuses sync calls on its loop; LetheStore's sync methods use their own client, so
    # they work from a worker thread while the loop runs (the part of LangGraph's test that applies)
    with ThreadPoolExecutor(max_workers=1) as executor:
        await asyncio.wrap_future(executor.submit(astore.put, ("foo", "bar"), "baz", {"val": "baz"}))
        item = await asyncio.wrap_future(executor.submit(astore.get, ("foo", "bar"), "baz"))
        assert item is not None and item.value == {"val": "baz"}
    astore.close()


async def test_large_batches_async(astore: LetheStore) -> None:
    n, m = 20, 2  # LangGraph's 1000 x 10, scaled to the suite's budget
    coros = []
    for j in range(m):
        for i in range(n):
            ns = ("test", "foo", "bar", "baz", str(j % 2))
            coros += [
                astore.aput(ns, f"key{i}", value={"foo": "bar" + str(i)}),
                astore.aget(ns, f"key{i}"),
                astore.alist_namespaces(prefix=None, max_depth=j + 1),
                astore.asearch(("test",)),
                astore.aput(ns, f"key{i}", value={"foo": "bar" + str(i)}),
                astore.adelete(ns, f"key{i}"),
            ]
    results = await asyncio.gather(*coros, return_exceptions=True)
    assert len(results) == m * n * 6
    # concurrent puts and deletes of one key: a put may lose to a delete it raced (DeletedWhileWriting), never fail
    # otherwise
    assert all(not isinstance(r, BaseException) or isinstance(r, DeletedWhileWriting) for r in results)


async def test_abatch_order(astore: LetheStore) -> None:
    await astore.aput(("test", "foo"), "key1", {"data": "value1"})
    await astore.aput(("test", "bar"), "key2", {"data": "value2"})
    ops: list[Op] = [
        GetOp(namespace=("test", "foo"), key="key1"),
        PutOp(namespace=("test", "bar"), key="key2", value={"data": "value2"}),
        SearchOp(namespace_prefix=("test",), filter={"data": "value1"}, limit=10, offset=0),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=10, offset=0),
        GetOp(namespace=("test",), key="key3"),
    ]
    results: list[Any] = await astore.abatch(ops)
    assert len(results) == 5
    assert isinstance(results[0], Item) and results[0].value == {"data": "value1"} and results[0].key == "key1"
    assert results[1] is None
    assert len(results[2]) == 1
    assert ("test", "foo") in results[3] and ("test", "bar") in results[3]
    assert results[4] is None

    ops_reordered: list[Op] = [
        SearchOp(namespace_prefix=("test",), filter=None, limit=5, offset=0),
        GetOp(namespace=("test", "bar"), key="key2"),
        ListNamespacesOp(match_conditions=None, max_depth=None, limit=5, offset=0),
        PutOp(namespace=("test",), key="key3", value={"data": "value3"}),
        GetOp(namespace=("test", "foo"), key="key1"),
    ]
    results = list(await astore.abatch(ops_reordered))
    assert len(results[0]) == 2
    assert isinstance(results[1], Item) and results[1].value == {"data": "value2"}
    assert ("test", "foo") in results[2] and ("test", "bar") in results[2]
    assert results[3] is None
    assert isinstance(results[4], Item) and results[4].value == {"data": "value1"}


async def test_abatch_put_ops(astore: LetheStore) -> None:
    ops = [
        PutOp(namespace=("test",), key="key1", value={"data": "value1"}),
        PutOp(namespace=("test",), key="key2", value={"data": "value2"}),
        PutOp(namespace=("test",), key="key3", value=None),
    ]
    assert await astore.abatch(ops) == [None, None, None]
    assert len(await astore.asearch(("test",), limit=10)) == 2


async def test_abatch_list_namespaces_ops(astore: LetheStore) -> None:
    await astore.aput(("test", "namespace1"), "key1", {"data": "value1"})
    await astore.aput(("test", "namespace2"), "key2", {"data": "value2"})
    results: list[Any] = await astore.abatch([ListNamespacesOp(match_conditions=None, max_depth=None, limit=10)])
    assert sorted(results[0]) == [("test", "namespace1"), ("test", "namespace2")]


# ---- Lethe: delete is a forget, and a writer that read before it cannot land after it ---------------------------


class _After(httpx.HTTPTransport):
    """Runs `then` once, right after the first response `when` picks: the moment between a writer's read and its
    write, held open while another client deletes the key."""

    def __init__(self, when: Callable[[httpx.Request, httpx.Response], bool], then: Callable[[], None]) -> None:
        super().__init__()
        self.when, self.then, self.done = when, then, False

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        if not self.done and self.when(request, response):
            self.done = True
            response.read()
            self.then()
        return response


def test_a_put_that_read_before_a_delete_is_refused(
    make_store: Callable[..., LetheStore], lethe_url: str, raw: httpx.Client
) -> None:
    other = make_store()
    other.put(("docs",), "k", {"v": "original"})
    # the batch reads the key (GetOp), then the delete lands and returns, then the batch's put based on that read
    hook = _After(lambda req, _: req.method == "GET", lambda: other.delete(("docs",), "k"))
    writer = make_store(http=httpx.Client(base_url=lethe_url, transport=hook))
    with pytest.raises(DeletedWhileWriting) as refused:
        writer.batch([GetOp(("docs",), "k"), PutOp(("docs",), "k", {"v": "late write"})])
    assert hook.done and refused.value.current_version == 2
    assert other.get(("docs",), "k") is None
    versions = _record(raw, other, ("docs",), "k", "/history").json()["versions"]
    assert [(v["op"], v["value"]) for v in versions] == [("write", None), ("forget", None)]


def test_a_plain_put_whose_read_preceded_a_delete_is_refused(
    make_store: Callable[..., LetheStore], lethe_url: str
) -> None:
    other = make_store()
    other.put(("docs",), "k", {"v": "original"})
    # a plain put reads through its create attempt (412 with the current version); the delete lands after that
    hook = _After(lambda req, res: req.method == "PUT" and res.status_code == 412, lambda: other.delete(("docs",), "k"))
    writer = make_store(http=httpx.Client(base_url=lethe_url, transport=hook))
    with pytest.raises(DeletedWhileWriting):
        writer.put(("docs",), "k", {"v": "late write"})
    assert hook.done and other.get(("docs",), "k") is None
    # a put issued after the delete (it reads the tombstone) re-establishes the key
    writer.put(("docs",), "k", {"v": "new life"})
    item = other.get(("docs",), "k")
    assert item is not None and item.value == {"v": "new life"}


def test_concurrent_puts_last_writer_wins(make_store: Callable[..., LetheStore], lethe_url: str) -> None:
    other = make_store()
    other.put(("docs",), "k", {"v": 1})
    # another put lands between this put's read and its write: it is overwritten, as LangGraph's stores do
    hook = _After(lambda req, res: req.method == "PUT" and res.status_code == 412,
                  lambda: other.put(("docs",), "k", {"v": 2}))
    writer = make_store(http=httpx.Client(base_url=lethe_url, transport=hook))
    writer.put(("docs",), "k", {"v": 3})
    item = other.get(("docs",), "k")
    assert hook.done and item is not None and item.value == {"v": 3}


def test_delete_is_a_forget(store: LetheStore, raw: httpx.Client) -> None:
    store.put(("docs",), "k", {"text": "my secret"})
    store.put(("docs",), "k", {"text": "my second secret"})
    store.delete(("docs",), "k")
    gone = _record(raw, store, ("docs",), "k")
    assert gone.status_code == 404 and gone.json()["forgotten"] is True
    history = _record(raw, store, ("docs",), "k", "/history").json()["versions"]
    assert "secret" not in str(history) and history[-1]["op"] == "forget"
    assert store.search(("docs",), query="secret") == []


# ---- Lethe: namespaces, keys and bad input ------------------------------------------------------------------------


def test_labels_and_keys_lethe_forbids_round_trip(store: LetheStore) -> None:
    namespace, key = ("a/b", "c:d", "100%", "tab\there"), "x/y:%z"
    store.put(namespace, key, {"v": 1})
    item = store.get(namespace, key)
    assert item is not None and item.namespace == namespace and item.key == key
    assert store.search(("a/b",))[0].namespace == namespace
    assert store.list_namespaces(prefix=("a/b",)) == [namespace]
    store.put(("empty",), "", {"v": "empty key"})
    assert [i.key for i in store.search(("empty",))] == [""]


def test_malformed_namespaces(store: LetheStore, raw: httpx.Client) -> None:
    # LangGraph's own checks, raised before any request
    for bad in (("a.b",), ("",), ("a\x00",)):
        with pytest.raises(InvalidNamespaceError):
            store.put(bad, "k", {"v": 1})
        with pytest.raises(InvalidNamespaceError):
            store.batch([GetOp(bad, "k")])  # ops given to batch directly are checked too
    with pytest.raises(InvalidNamespaceError):
        store.put((), "k", {"v": 1})
    with pytest.raises(InvalidNamespaceError):
        store.put(("langgraph", "x"), "k", {"v": 1})
    # what only Lethe refuses (a namespace over 200 characters) is its 422, raised as ValidationError
    with pytest.raises(ValidationError):
        store.put(("x" * 300,), "k", {"v": 1})
    # and Lethe's API answers 422 for a malformed namespace however it is reached
    for path in ("/v1/memory/a%3Ab/k", "/v1/memory/a%0Ab/k"):
        assert raw.get(path).status_code == 422
    assert raw.post("/v1/memory:search", json={"namespace_prefix": "a/b"}).status_code == 422


# ---- Lethe: semantic search and TTL ---------------------------------------------------------------------------------


def test_semantic_search_ranks_the_relevant_item_first(vector_store: LetheStore) -> None:
    ns = ("user", "memories")
    vector_store.put(ns, "pet", {"text": "I have a golden retriever named Max"})
    vector_store.put(ns, "food", {"text": "My favourite dish is spaghetti carbonara"})
    vector_store.put(ns, "job", {"text": "I work as a nurse in the night shift"})
    results = vector_store.search(ns, query="what dog does the user own?")
    assert results[0].key == "pet"
    assert results[0].score is not None and all(r.score is not None and r.score < results[0].score
                                                for r in results[1:])
    assert vector_store.search(ns, query="Italian pasta")[0].key == "food"


def test_an_expired_item_is_forgotten(store: LetheStore, raw: httpx.Client) -> None:
    store.put(("t",), "brief", {"text": "expires at its write"}, ttl=0)
    assert store.get(("t",), "brief") is None
    history = _record(raw, store, ("t",), "brief", "/history").json()["versions"]
    assert [(v["op"], v["source"], v["value"]) for v in history] == [("write", "agent", None), ("forget", "ttl", None)]
    store.put(("t",), "brief", {"text": "a new life"})  # a put after the expiry re-establishes it
    item = store.get(("t",), "brief")
    assert item is not None and item.value == {"text": "a new life"}


def test_refresh_on_read_restarts_the_time_to_live(store: LetheStore, raw: httpx.Client) -> None:
    store.put(("t",), "k", {"v": 1}, ttl=60)

    def expires() -> str:
        value: str = _record(raw, store, ("t",), "k").json()["expires_at"]
        return value

    written = expires()
    assert store.get(("t",), "k", refresh_ttl=False) is not None and expires() == written
    assert store.get(("t",), "k") is not None  # ttl_config refresh_on_read: True
    refreshed = expires()
    assert refreshed > written
    assert store.search(("t",), refresh_ttl=False) and expires() == refreshed
    assert store.search(("t",)) and expires() > refreshed
    store.put(("t",), "k", {"v": 2}, ttl=None)
    assert _record(raw, store, ("t",), "k").json()["expires_at"] is None


def test_default_ttl_applies(store: LetheStore, raw: httpx.Client) -> None:
    store.put(("t",), "k", {"v": 1})  # ttl_config default_ttl: 10 minutes
    assert _record(raw, store, ("t",), "k").json()["expires_at"] is not None


class _Counting(httpx.HTTPTransport):
    def __init__(self) -> None:
        super().__init__()
        self.sent: list[str] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        response = super().handle_request(request)
        self.sent.append(f"{request.method} {response.status_code}")
        return response


def test_a_put_of_a_key_seen_before_guesses_its_version(
    make_store: Callable[..., LetheStore], lethe_url: str
) -> None:
    """An update of a key this store wrote is one round trip; a stale guess costs one 412 and changes nothing of
    what the put does: another put is overwritten, a delete the store never saw is answered as a create's would be."""
    other = make_store()
    wire = _Counting()
    writer = make_store(http=httpx.Client(base_url=lethe_url, transport=wire))
    writer.put(("docs",), "k", {"v": 1})
    writer.put(("docs",), "k", {"v": 2})
    assert wire.sent == ["PUT 201", "PUT 200"]

    other.put(("docs",), "k", {"v": "other"})  # the guess is stale now: last writer wins, as without it
    writer.put(("docs",), "k", {"v": 3})
    assert wire.sent[2:] == ["PUT 412", "PUT 200"]
    item = other.get(("docs",), "k")
    assert item is not None and item.value == {"v": 3}

    other.delete(("docs",), "k")  # a tombstone this store never saw: the 412 reads it, the put re-establishes
    writer.put(("docs",), "k", {"v": 4})
    assert wire.sent[4:] == ["PUT 412", "PUT 200"]
    item = other.get(("docs",), "k")
    assert item is not None and item.value == {"v": 4}
