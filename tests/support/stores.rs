//! Test wrappers around a table store: [`forward_table_store!`] writes the methods a wrapper
//! leaves to its inner store, so a wrapper spells out only what it changes.

/// Inside `impl TableStore for Wrapper`, forwards the named methods (any of
/// `query_page`, `submit_batch_with_etags`, `get_entity`, `create_table`, `delete_table`) to
/// the field `inner`: `forward_table_store!(inner: get_entity, create_table, delete_table);`.
#[allow(unused_macros)]
macro_rules! forward_table_store {
    ($inner:ident: $($method:ident),+ $(,)?) => {
        $(forward_table_store!(@ $inner $method);)+
    };
    (@ $inner:ident query_page) => {
        async fn query_page(
            &self,
            table: &str,
            query: &tablescan::storage::Query,
        ) -> tablescan::storage::StorageResult<tablescan::storage::Page> {
            self.$inner.query_page(table, query).await
        }
    };
    (@ $inner:ident submit_batch_with_etags) => {
        async fn submit_batch_with_etags(
            &self,
            table: &str,
            partition_key: &str,
            operations: &[tablescan::storage::BatchOperation],
        ) -> tablescan::storage::StorageResult<Vec<Option<String>>> {
            self.$inner
                .submit_batch_with_etags(table, partition_key, operations)
                .await
        }
    };
    (@ $inner:ident get_entity) => {
        async fn get_entity(
            &self,
            table: &str,
            partition_key: &str,
            row_key: &str,
        ) -> tablescan::storage::StorageResult<Option<(tablescan::storage::Entity, String)>> {
            self.$inner.get_entity(table, partition_key, row_key).await
        }
    };
    (@ $inner:ident create_table) => {
        async fn create_table(&self, table: &str) -> tablescan::storage::StorageResult<bool> {
            self.$inner.create_table(table).await
        }
    };
    (@ $inner:ident delete_table) => {
        async fn delete_table(&self, table: &str) -> tablescan::storage::StorageResult<bool> {
            self.$inner.delete_table(table).await
        }
    };
}
#[allow(unused_imports)]
pub(crate) use forward_table_store;
