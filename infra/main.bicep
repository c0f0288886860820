// tablescan on Azure Functions Flex Consumption, keyless end to end.
//
// Deploys into one resource group:
//   - a storage account with shared-key access off (the host's storage, tablescan's queues and
//     bookkeeping tables, the default source/destination account, and the deployment container);
//   - a Flex Consumption plan (FC1) and a Linux function app with runtime `custom` 1.0, a
//     system-assigned identity, and the deployment container authenticated with that identity;
//   - role assignments for that identity: blob, queue and table data roles on the account, and
//     Monitoring Metrics Publisher on Application Insights;
//   - a Log Analytics workspace and a workspace-based Application Insights that accepts only
//     Entra ID-authenticated telemetry;
//   - every app setting the Functions host and tablescan need (docs/configuration.md).
//
// Deploy (docs/deploy.md, "Flex Consumption"):
//   az deployment group create --resource-group RG --template-file infra/main.bicep \
//     --parameters @infra/main.parameters.json
//
// Shapes and API versions follow Microsoft's Flex Consumption samples:
//   https://github.com/Azure-Samples/azure-functions-flex-consumption-samples/blob/main/IaC/bicep/core/host/function.bicep
//   https://github.com/Azure-Samples/azure-functions-flex-consumption-samples/blob/main/IaC/bicep/rbac.bicep
//   https://github.com/Azure-Samples/functions-quickstart-dotnet-azd/blob/main/infra/main.bicep
// Property reference: https://learn.microsoft.com/azure/templates/microsoft.web/sites
// Plan: https://learn.microsoft.com/azure/azure-functions/flex-consumption-plan
//
// Nothing here names an account key, a SAS or a keyed connection string: tests/deploy/infra.rs checks
// that, and that every setting the handler requires is set.

@description('Region of every resource. Must offer Flex Consumption: az functionapp list-flexconsumption-locations')
param location string = resourceGroup().location

@description('Function app name (globally unique; also its host name APP.azurewebsites.net).')
param appName string = 'tablescan-${uniqueString(resourceGroup().id)}'

@description('Storage account name: 3-24 lowercase letters and digits, globally unique.')
@minLength(3)
@maxLength(24)
param storageAccountName string = 'st${uniqueString(resourceGroup().id)}'

// Instance sizes (MB): 512 (0.25 core), 2048 (1 core), 4096 (2 cores); 2048 is the platform's
// default. https://learn.microsoft.com/azure/azure-functions/flex-consumption-plan#instance-sizes
// The handler peaks at 27–81 MiB in the benchmark; docs/deploy.md ("Instance memory") explains the choice.
@description('Memory of each instance in MB.')
@allowed([
  512
  2048
  4096
])
param instanceMemoryMB int = 2048

// Flex's stack data for runtime `custom` on FC1 allows 40 to 1000 (platform default 100); lower
// values are a preview in a few regions only, and there the cap covers all function groups
// together (infra/README.md, "Sources"). It applies to each per-function scale group (PrefixScan
// and TableCopy scale separately), always-ready instances not counted.
// https://learn.microsoft.com/azure/azure-functions/event-driven-scaling#limit-scale-out
// 40, the lowest allowed: at 40 instances per function a big copy can ask more of one storage
// account than its 20,000 requests/s (docs/deploy.md, "Scale"); the instance cap is not the way to bound
// that load.
@description('Most on-demand instances per function (scale group): 40 to 1000.')
@minValue(40)
@maxValue(1000)
param maximumInstanceCount int = 40

@description('NCRONTAB schedule (with seconds, UTC) of the Scheduler timer, which starts the scans of /api/schedules that are due. Every minute by default.')
param schedulerSchedule string = '0 * * * * *'

@description('Queue of scan steps (consumed by PrefixScan; poison queue <name>-poison). At most 56 characters.')
@maxLength(56)
param prefixScanQueue string = 'tablescan-prefixscan'

@description('Queue of copy work items (consumed by TableCopy; poison queue <name>-poison). At most 56 characters.')
@maxLength(56)
param tableCopyQueue string = 'tablescan-tablecopy'

@description('Table of scan records.')
param scansTable string = 'TablescanScans'

@description('Table of pending work items and sharded counters.')
param workTable string = 'TablescanWork'

@description('Handler log filter (tracing env-filter syntax).')
param rustLog string = 'info'

// Each entry: { name: 'ARCHIVE', accountName: 'otheraccount' }. A scan request may then name
// ARCHIVE as its source or destination connection. The connection is identity-based
// (ARCHIVE__accountName) and uses this app's system-assigned identity, which needs Storage Table
// Data Contributor on that account: grant it there (docs/configuration.md, "A second account as a
// scan source or destination"); this template only assigns roles on its own account.
@description('Other storage accounts a scan may name as source or destination: [{ name, accountName }].')
param scanConnections array = []

var deploymentContainerName = 'app-package'

// Built-in role definition ids, from
// https://learn.microsoft.com/azure/role-based-access-control/built-in-roles and Microsoft's
// Flex sample rbac.bicep (link above).
var roleIds = {
  // The host's keys, leases and timers, and reading the deployment package.
  storageBlobDataOwner: 'b7e6dc6d-f1e8-4753-8033-0f276bb0955b'
  // Queue triggers (the host) and tablescan's enqueues.
  storageQueueDataContributor: '974c5e8b-45b9-4653-ba55-5f855dd0fb88'
  // tablescan's scans and work tables, and the tables it scans and copies on this account.
  storageTableDataContributor: '0a9a7e1f-b9d0-4cc4-a60d-0319b160aaa3'
  // Entra ID-authenticated telemetry ingestion into Application Insights.
  monitoringMetricsPublisher: '3913510d-42f4-4e42-8a64-420c390055eb'
}

resource storage 'Microsoft.Storage/storageAccounts@2023-05-01' = {
  name: storageAccountName
  location: location
  kind: 'StorageV2'
  sku: {
    name: 'Standard_LRS'
  }
  properties: {
    // Entra ID only: no account key or SAS works. The host (identity-based AzureWebJobsStorage),
    // the deployment container and tablescan (docs/configuration.md, "Keyless connections") all use tokens.
    allowSharedKeyAccess: false
    defaultToOAuthAuthentication: true
    allowBlobPublicAccess: false
    minimumTlsVersion: 'TLS1_2'
    supportsHttpsTrafficOnly: true
  }
}

resource blobService 'Microsoft.Storage/storageAccounts/blobServices@2023-05-01' = {
  parent: storage
  name: 'default'
}

resource deploymentContainer 'Microsoft.Storage/storageAccounts/blobServices/containers@2023-05-01' = {
  parent: blobService
  name: deploymentContainerName
  properties: {
    publicAccess: 'None'
  }
}

resource logAnalytics 'Microsoft.OperationalInsights/workspaces@2023-09-01' = {
  name: 'log-${appName}'
  location: location
  properties: {
    sku: {
      name: 'PerGB2018'
    }
    retentionInDays: 30
  }
}

// Workspace-based Application Insights. DisableLocalAuth: only telemetry sent with an Entra ID
// token is accepted; the host sends it with the app's identity (APPLICATIONINSIGHTS_AUTHENTICATION_STRING
// below) after it is granted Monitoring Metrics Publisher here.
// https://learn.microsoft.com/azure/azure-monitor/app/azure-ad-authentication
resource appInsights 'Microsoft.Insights/components@2020-02-02' = {
  name: 'appi-${appName}'
  location: location
  kind: 'web'
  properties: {
    Application_Type: 'web'
    WorkspaceResourceId: logAnalytics.id
    DisableLocalAuth: true
  }
}

// Flex Consumption plan: one app per plan, Linux (reserved).
resource plan 'Microsoft.Web/serverfarms@2024-04-01' = {
  name: 'plan-${appName}'
  location: location
  kind: 'functionapp'
  sku: {
    tier: 'FlexConsumption'
    name: 'FC1'
  }
  properties: {
    reserved: true
  }
}

// What the host and the handler read. On Flex Consumption the runtime is part of
// functionAppConfig: FUNCTIONS_WORKER_RUNTIME, FUNCTIONS_EXTENSION_VERSION, WEBSITE_RUN_FROM_PACKAGE
// and the content-share settings are not set.
// https://learn.microsoft.com/azure/azure-functions/functions-app-settings#flex-consumption-plan-deprecations
var appSettings = [
  // Identity-based host storage, read by the Functions host and by tablescan alike: the account's
  // public-cloud blob/queue/table endpoints, with the system-assigned identity (the default when
  // no __credential/__clientId is given, for the host and for tablescan).
  // https://learn.microsoft.com/azure/azure-functions/functions-reference#connecting-to-host-storage-with-an-identity
  {
    name: 'AzureWebJobsStorage__accountName'
    value: storage.name
  }
  {
    name: 'APPLICATIONINSIGHTS_CONNECTION_STRING'
    value: appInsights.properties.ConnectionString
  }
  // Entra ID ingestion with the system-assigned identity (a user-assigned one would add ClientId=...).
  // https://learn.microsoft.com/azure/azure-functions/functions-app-settings#applicationinsights_authentication_string
  {
    name: 'APPLICATIONINSIGHTS_AUTHENTICATION_STRING'
    value: 'Authorization=AAD'
  }
  // The queue functions' function.json name their queues as %TABLESCAN_PREFIXSCAN_QUEUE% and
  // %TABLESCAN_TABLECOPY_QUEUE% (plus -poison): the host does not load them while these are unset.
  {
    name: 'TABLESCAN_PREFIXSCAN_QUEUE'
    value: prefixScanQueue
  }
  {
    name: 'TABLESCAN_TABLECOPY_QUEUE'
    value: tableCopyQueue
  }
  // The Scheduler's function.json names its schedule as %TABLESCAN_SCHEDULER_SCHEDULE%: the host
  // does not load the function while it is unset.
  {
    name: 'TABLESCAN_SCHEDULER_SCHEDULE'
    value: schedulerSchedule
  }
  {
    name: 'TABLESCAN_SCANS_TABLE'
    value: scansTable
  }
  {
    name: 'TABLESCAN_WORK_TABLE'
    value: workTable
  }
  // Must equal host.json extensions.queues.maxDequeueCount (tests/deploy/infra.rs checks it).
  {
    name: 'TABLESCAN_MAX_DEQUEUE_COUNT'
    value: '5'
  }
  // The handler runs on one thread; a 4,096 MB instance has two cores (docs/deploy.md, "Instance memory").
  {
    name: 'TABLESCAN_HANDLER_THREADS'
    value: instanceMemoryMB >= 4096 ? '2' : '1'
  }
  {
    name: 'RUST_LOG'
    value: rustLog
  }
]

// Only when scanConnections is given: TABLESCAN_CONNECTIONS and one <NAME>__accountName each.
var scanConnectionSettings = empty(scanConnections)
  ? []
  : concat(
      [
        {
          name: 'TABLESCAN_CONNECTIONS'
          value: join(map(scanConnections, c => c.name), ',')
        }
      ],
      map(scanConnections, c => {
        name: '${c.name}__accountName'
        value: c.accountName
      })
    )

resource functionApp 'Microsoft.Web/sites@2024-04-01' = {
  name: appName
  location: location
  kind: 'functionapp,linux'
  identity: {
    type: 'SystemAssigned'
  }
  properties: {
    serverFarmId: plan.id
    httpsOnly: true
    siteConfig: {
      minTlsVersion: '1.2'
      appSettings: concat(appSettings, scanConnectionSettings)
    }
    functionAppConfig: {
      // One deploy: packages go to this container, read with the app's identity (Storage Blob Data
      // Owner below), so deployments keep working with shared keys off.
      // https://learn.microsoft.com/azure/azure-functions/flex-consumption-how-to#configure-deployment-settings
      deployment: {
        storage: {
          type: 'blobContainer'
          value: '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
          authentication: {
            type: 'SystemAssignedIdentity'
          }
        }
      }
      scaleAndConcurrency: {
        instanceMemoryMB: instanceMemoryMB
        maximumInstanceCount: maximumInstanceCount
      }
      // Custom handler (host.json customHandler): the runtime name `custom`, version 1.0.
      // https://learn.microsoft.com/python/api/azure-mgmt-web/azure.mgmt.web.models.runtimename
      runtime: {
        name: 'custom'
        version: '1.0'
      }
    }
  }
  dependsOn: [
    deploymentContainer
  ]
}

// The app's identity on its own account: blob (host, deployment), queue (triggers, tablescan's
// enqueues), table (tablescan). Scoped to the account, as in Microsoft's rbac.bicep.
resource blobOwner 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, functionApp.id, roleIds.storageBlobDataOwner)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageBlobDataOwner)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource queueContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, functionApp.id, roleIds.storageQueueDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageQueueDataContributor)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource tableContributor 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(storage.id, functionApp.id, roleIds.storageTableDataContributor)
  scope: storage
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.storageTableDataContributor)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

resource metricsPublisher 'Microsoft.Authorization/roleAssignments@2022-04-01' = {
  name: guid(appInsights.id, functionApp.id, roleIds.monitoringMetricsPublisher)
  scope: appInsights
  properties: {
    roleDefinitionId: subscriptionResourceId('Microsoft.Authorization/roleDefinitions', roleIds.monitoringMetricsPublisher)
    principalId: functionApp.identity.principalId
    principalType: 'ServicePrincipal'
  }
}

output functionAppName string = functionApp.name
output storageAccountName string = storage.name
output principalId string = functionApp.identity.principalId
output deploymentContainerUrl string = '${storage.properties.primaryEndpoints.blob}${deploymentContainerName}'
