import assert from 'node:assert/strict';
import { describe, test } from 'node:test';
import { Stack } from 'aws-cdk-lib';
import * as sqs from 'aws-cdk-lib/aws-sqs';
import { LeaselockStack } from '../lib/leaselock-stack';
import { nagViolations, placeholderCodeDirs, testApp } from './fixtures';

describe('cdk-nag AwsSolutions', () => {
  test('finds nothing in the coordinator alone', () => {
    const app = testApp();
    new LeaselockStack(app, 'Leaselock', { coordinator: placeholderCodeDirs() });
    assert.deepEqual(nagViolations(app), []);
  });

  test('finds nothing in the coordinator with a worker fleet pulling from private ECR', () => {
    const app = testApp();
    new LeaselockStack(app, 'Leaselock', {
      coordinator: placeholderCodeDirs(),
      workerImage: '123456789012.dkr.ecr.us-east-1.amazonaws.com/leaselock-worker:1.0.0',
    });
    assert.deepEqual(nagViolations(app), []);
  });

  test('reports what it finds (control: a queue without DLQ or TLS policy)', () => {
    const app = testApp();
    new sqs.Queue(new Stack(app, 'Control'), 'Queue');
    assert.deepEqual(nagViolations(app).sort(), [
      'AwsSolutions-SQS3 at Control/Queue/Resource',
      'AwsSolutions-SQS4 at Control/Queue/Resource',
    ]);
  });
});
