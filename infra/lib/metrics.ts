import { Duration } from 'aws-cdk-lib';
import * as cloudwatch from 'aws-cdk-lib/aws-cloudwatch';

/** Namespace of the EMF metrics that the reconciler and the workers write to their logs. */
export const DEFAULT_METRICS_NAMESPACE = 'leaselock';

/** Value of the `Service` dimension on every leaselock metric. */
export type MetricSource = 'reconciler' | 'worker';

/** One leaselock EMF metric, aggregated per minute (the reconciler's default cadence). */
export function leaseMetric(
  namespace: string,
  source: MetricSource,
  metricName: string,
  statistic: string,
): cloudwatch.Metric {
  return new cloudwatch.Metric({
    namespace,
    metricName,
    dimensionsMap: { Service: source },
    statistic,
    period: Duration.minutes(1),
  });
}
